"""`/metrics` served from a body rendered where the pipeline lives (the agent's pipeline thread), not on the
event loop: prometheus_client's own encoders over the agent's registry, per `Accept` (text or OpenMetrics),
`name[]` filter and gzip, kept and refreshed by a `Renderer` (sinks/api/render_cache.py). A scrape reads the
clock (lag, gap seconds), so a body is reused for one state version and at most `max_age_s`. Scrapers come at
a steady interval (Prometheus: 15-60 s): a body is rebuilt ahead once per interval, just before the next scrape
is due, not every `max_age_s` in between (at GPU rates a render costs ~20-30 ms of the pipeline thread).
"""

from __future__ import annotations

import gzip
import time
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, TypeVar
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder
from prometheus_client.registry import CollectorRegistry
from starlette.types import Message, Receive, Scope, Send

from attrib_agent.sinks.api.render_cache import GZIP_LEVEL, GZIP_MIN_BYTES, Renderer

Rendered = tuple[list[tuple[bytes, bytes]], bytes]  # (headers, body)
T = TypeVar("T")
AHEAD_S = 0.75  # a body is rebuilt ahead this long before its next scrape is due (the refresher's tick and a batch)


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
                 serve_stale_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.renderer: Renderer[Rendered] = ScrapeRenderer(version, read, max_age_s=max_age_s,
                                                           serve_stale_s=serve_stale_s, clock=clock)

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


class ScrapeRenderer(Renderer[T]):
    """A Renderer that rebuilds a hot body ahead once before its next request is due: one interval (the last gap
    between two requests for it) after the last, less AHEAD_S. A request that comes early finds the body as a
    plain Renderer would without a refresher (rebuilt, or the last one while the pipeline thread is busy)."""

    def __init__(self, *args: Any, **kw: Any) -> None:
        super().__init__(*args, **kw)
        self.gaps: dict[Hashable, float] = {}  # key -> the last interval between two requests for it

    async def get(self, key: Hashable, build: Callable[[], T]) -> T:
        last = self._asked.get(key)
        if last is not None:
            self.gaps[key] = self._clock() - last[0]
        for gone in [k for k in self.gaps if k not in self._asked]:  # bounded as the asked keys are
            del self.gaps[gone]
        return await super().get(key, build)

    def _due(self, key: Hashable, asked: float, now: float) -> bool:
        gap = self.gaps.get(key)
        if gap is None:
            return False
        due = asked + gap - AHEAD_S
        kept = self.cache.entry(key)
        return now >= due and (kept is None or kept[1] < due)  # once: not again for every change after it


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    start: Message = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
