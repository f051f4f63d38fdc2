"""`/metrics` served from a body rendered where the pipeline lives (the agent's pipeline thread), not on the
event loop: prometheus_client's own encoders over the agent's registry, per `Accept` (text or OpenMetrics),
`name[]` filter and gzip, kept and refreshed by a `Renderer` (sinks/api/render_cache.py).

Two parts make a body. The pipeline part (attribution, KV, cost model, forecast: 40-60 ms a build at GPU rates,
most of it lazy pipeline work the KV picture forces) is built on the pipeline thread and kept: reused while the
state version is unchanged (and at most `max_age_s`, if set), rebuilt on demand when a scrape finds it out of
date (the scrape waits up to the Renderer's `fresh_wait_s` for it), and rebuilt ahead at most every `ahead_s`
while scraped, not at every change (at GPU rates the state changes with every event). When the pipeline thread
is in a long pass, the scrape gets the kept part, never older than `serve_stale_s` (older, the scrape waits for
the build). The live part (vLLM's gap, the sources' health, backlog and lag, build and mode) is read on the loop
at every scrape, so those series are always current, and appended: a gzip body is the kept part's deflate
blocks, compressed once, then the live part's (`_Kept`), one stream.
"""

from __future__ import annotations

import struct
import time
import zlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any
from urllib.parse import parse_qs

from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import Metric
from prometheus_client.registry import CollectorRegistry
from starlette.types import Message, Receive, Scope, Send

from attrib_agent.sinks.api.render_cache import GZIP_LEVEL, GZIP_MIN_BYTES, Renderer

Rendered = tuple[list[tuple[bytes, bytes]], bytes]  # (headers, body)
EOF = b"# EOF\n"  # OpenMetrics' last line: after the live part


class _Kept:
    """The pipeline part of one body (content type, query), as it is kept between scrapes: its text, and for
    gzip its deflate blocks, compressed once and ended byte-aligned (a sync flush, not the last block) with
    their CRC. A scrape appends the live part's own deflate blocks (a fresh compressor: no back-reference into
    the kept part) and the trailer: one gzip stream, without keeping a compressor's state (~256 KB) per body."""

    __slots__ = ("content_type", "text", "_deflated", "_crc")

    def __init__(self, content_type: str, text: bytes, gzip_ok: bool) -> None:
        self.content_type, self.text = content_type, text
        self._deflated: bytes | None = None
        self._crc = 0
        if gzip_ok and len(text) >= GZIP_MIN_BYTES:
            self._deflated = _deflate(text, zlib.Z_SYNC_FLUSH)
            self._crc = zlib.crc32(text)

    def finish(self, live: bytes) -> Rendered:
        """The whole body: this part, then `live` (read now), gzipped if this part was."""
        headers = [(b"content-type", self.content_type.encode())]
        if self._deflated is None:
            body = self.text + live
        else:
            size = (len(self.text) + len(live)) & 0xFFFFFFFF
            body = b"".join((_GZIP_HEADER, self._deflated, _deflate(live, zlib.Z_FINISH),
                             struct.pack("<II", zlib.crc32(live, self._crc), size)))
            headers.append((b"content-encoding", b"gzip"))
        headers.append((b"vary", b"Accept-Encoding"))
        return headers, body


# RFC 1952: magic, deflate, no flags, no mtime, no extra flags, OS unknown
_GZIP_HEADER = b"\x1f\x8b\x08\x00\x00\x00\x00\x00\x00\xff"


def _deflate(data: bytes, end: int) -> bytes:
    """Raw deflate blocks of `data` (no header), ended by `end` (Z_SYNC_FLUSH: byte-aligned, more may follow)."""
    c = zlib.compressobj(GZIP_LEVEL, zlib.DEFLATED, -15)
    return c.compress(data) + c.flush(end)


def _encode(registry: CollectorRegistry, accept: str, names: tuple[str, ...]) -> tuple[bytes, str]:
    encoder, content_type = choose_encoder(accept)
    return encoder(registry.restricted_registry(list(names)) if names else registry), content_type


def render(registry: CollectorRegistry, accept: str, names: tuple[str, ...], gzip_ok: bool,
           live: CollectorRegistry | None = None) -> Rendered:
    """One exposition body, as prometheus_client's ASGI app would send it (built in one go)."""
    return _pipeline_part(registry, accept, names, gzip_ok, live is not None).finish(
        _live_part(None if live is None else _LiveText(live), accept, names))


def _pipeline_part(registry: CollectorRegistry, accept: str, names: tuple[str, ...], gzip_ok: bool,
                   more: bool) -> _Kept:
    text, content_type = _encode(registry, accept, names)
    return _Kept(content_type, _strip_eof(text) if more else text, gzip_ok)  # the live part ends the body


class _LiveText:
    """The live part's text, encoded family by family and kept by value: of its ~18 families only a few change
    between scrapes (lag, backlog seconds, the sources' success counts), and prometheus_client's OpenMetrics
    encoder escapes every HELP text character by character (~1 ms a scrape on the loop, all families encoded)."""

    def __init__(self, registry: CollectorRegistry, max_entries: int = 256) -> None:
        self.registry, self._max = registry, max_entries
        self._texts: OrderedDict[Hashable, bytes] = OrderedDict()

    def encode(self, accept: str, names: tuple[str, ...]) -> bytes:
        encoder, content_type = choose_encoder(accept)  # the content type names the format, escaping, version
        source = self.registry.restricted_registry(list(names)) if names else self.registry
        out = [self._family(encoder, content_type, fam) for fam in source.collect()]
        if content_type.startswith("application/openmetrics-text"):
            out.append(EOF)
        return b"".join(out)

    def _family(self, encoder: Callable[[Any], bytes], content_type: str, fam: Metric) -> bytes:
        if any(s.exemplar is not None or s.native_histogram is not None for s in fam.samples):
            return _strip_eof(encoder(_One(fam)))  # not kept (no exemplar or native histogram here today)
        key = (content_type, fam.name, fam.type, fam.unit, fam.documentation,
               tuple((s.name, tuple(sorted(s.labels.items())), s.value, s.timestamp) for s in fam.samples))
        text = self._texts.get(key)
        if text is None:
            text = self._texts[key] = _strip_eof(encoder(_One(fam)))
            while len(self._texts) > self._max:
                self._texts.popitem(last=False)
        else:
            self._texts.move_to_end(key)
        return text


class _One:
    """One family, as something an encoder can collect."""

    def __init__(self, fam: Metric) -> None:
        self.fam = fam

    def collect(self) -> list[Metric]:
        return [self.fam]


def _strip_eof(text: bytes) -> bytes:
    return text[: -len(EOF)] if text.endswith(EOF) else text


def _live_part(live: _LiveText | None, accept: str, names: tuple[str, ...]) -> bytes:
    return b"" if live is None else live.encode(accept, names)


class MetricsEndpoint:
    """The ASGI app of `/metrics` (GET; any other method is answered 405). `registry` is read where the pipeline
    lives and kept; `live`, if given, on the loop at every scrape (collector.split_registries)."""

    def __init__(self, registry: CollectorRegistry, version: Callable[[], int],
                 read: Callable[[Callable[[], Any]], Awaitable[Any]], *, max_age_s: float | None,
                 serve_stale_s: float = 0.0, ahead_s: float = 0.0, live: CollectorRegistry | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.registry = registry
        self.live = None if live is None else _LiveText(live)
        self.renderer: Renderer[_Kept] = Renderer(version, read, max_age_s=max_age_s, serve_stale_s=serve_stale_s,
                                                  ahead_s=ahead_s, clock=clock)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope.get("method", "GET") not in ("GET", "HEAD"):
            await _send(send, 405, [(b"content-type", b"text/plain")], b"method not allowed")
            return
        headers = scope.get("headers", ())
        accept = ",".join(v.decode("latin-1") for k, v in headers if k == b"accept")
        gzip_ok = any(k == b"accept-encoding" and b"gzip" in v for k, v in headers)
        names = tuple(sorted(parse_qs(scope.get("query_string", b"").decode("latin-1")).get("name[]", [])))
        more = self.live is not None
        kept = await self.renderer.get(
            (accept, names, gzip_ok), lambda: _pipeline_part(self.registry, accept, names, gzip_ok, more))
        out_headers, body = kept.finish(_live_part(self.live, accept, names))
        await _send(send, 200, out_headers, body)


async def _send(send: Send, status: int, headers: list[tuple[bytes, bytes]], body: bytes) -> None:
    start: Message = {"type": "http.response.start", "status": status, "headers": headers}
    await send(start)
    await send({"type": "http.response.body", "body": body})
