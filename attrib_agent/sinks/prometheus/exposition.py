"""`/metrics` served from a body rendered where the pipeline lives (the agent's pipeline thread), not on the
event loop: prometheus_client's own encoders over the agent's registry, per `Accept` (text or OpenMetrics),
`name[]` filter and gzip, kept and refreshed by a `Renderer` (sinks/api/render_cache.py). A scrape reads the
clock (lag, gap seconds), so a body is reused for one state version and at most `max_age_s`.
"""

from __future__ import annotations

import gzip
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from starlette.types import Message, Receive, Scope, Send

from attrib_agent.sinks.api.render_cache import GZIP_LEVEL, GZIP_MIN_BYTES, Renderer

Rendered = tuple[list[tuple[bytes, bytes]], bytes]  # (headers, body)


def render(registry: CollectorRegistry, accept: str, names: tuple[str, ...], gzip_ok: bool) -> Rendered:
    """One exposition body, as prometheus_client's ASGI app would send it."""
    encoder, content_type = choose_encoder(accept)
    body = encoder(registry.restricted_registry(list(names)) if names else registry)
    headers = [(b"content-type", content_type.encode())]
    if gzip_ok and len(body) >= GZIP_MIN_BYTES:
        body = gzip.compress(body, compresslevel=GZIP_LEVEL, mtime=0)
        headers.append((b"content-encoding", b"gzip"))
    headers.append((b"vary", b"Accept-Encoding"))
    return headers, body


class MetricsEndpoint:
    """The ASGI app of `/metrics` (GET; any other method is answered 405)."""

    def __init__(self, registry: CollectorRegistry, version: Callable[[], int],
                 read: Callable[[Callable[[], Any]], Awaitable[Any]], *, max_age_s: float,
                 serve_stale_s: float = 0.0) -> None:
        self.registry = registry
        self.renderer: Renderer[Rendered] = Renderer(version, read, max_age_s=max_age_s, serve_stale_s=serve_stale_s)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method", "GET") not in ("GET", "HEAD"):
            await _send(send, 405, [(b"content-type", b"text/plain")], b"method not allowed")
            return
        headers = scope.get("headers", ())
        accept = ",".join(v.decode("latin-1") for k, v in headers if k == b"accept")
        gzip_ok = any(k == b"accept-encoding" and b"gzip" in v for k, v in headers)
        names = tuple(sorted(parse_qs(scope.get("query_string", b"").decode("latin-1")).get("name[]", [])))
        out_headers, body = await self.renderer.get(
            (accept, names, gzip_ok), lambda: render(self.registry, accept, names, gzip_ok))
        await _send(send, 200, out_headers, body)


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    start: Message = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
