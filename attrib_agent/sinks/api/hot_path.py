"""The API's per-request machinery kept small: its busiest route answered without Starlette's router, and gzip
without Starlette's per-request set-up.

At 200 requests/s, nine in ten are `GET /v1/requests/{id}/culprits`, answered from the store in ~0.1 ms; the
layers around them (router, exception middleware, request object, gzip responder) cost as much again on the
event loop. `CulpritsRoute` (the innermost middleware, under the token check and gzip) hands that one route to
its handler directly; everything else, HEAD included, goes through Starlette as before. `GZip` applies the rules
of Starlette's GZipMiddleware (same minimum size, level, excluded types, `Vary`, `Content-Length`), but does
nothing per request beyond one look at `Accept-Encoding` and at each response's first headers.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Awaitable, Callable
from typing import Final

from starlette.datastructures import MutableHeaders
from starlette.middleware.gzip import DEFAULT_EXCLUDED_CONTENT_TYPES
from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

CULPRITS_PATH: Final = re.compile(r"/v1/requests/([^/]+)/culprits")  # the Route's `{request_id}`: [^/]+
_EXCLUDED: Final = frozenset(t.partition(";")[0].strip().lower() for t in DEFAULT_EXCLUDED_CONTENT_TYPES)


class CulpritsRoute:
    """`GET /v1/requests/{id}/culprits` to `handler(id)`, the rest to `app` (the Starlette stack). A failure
    propagates as a route's does: to the app's outermost error handler (a JSON 500)."""

    def __init__(self, app: ASGIApp, handler: Callable[[str], Awaitable[Response]]) -> None:
        self.app, self.handler = app, handler

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "GET" and not scope.get("root_path"):
            match = CULPRITS_PATH.fullmatch(scope["path"])
            if match is not None:
                response = await self.handler(match.group(1))
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)


class GZip:
    """Bodies of `minimum_size` bytes or more gzipped for a client that accepts it (and `Vary: Accept-Encoding`
    on them either way); a response that already has a Content-Encoding, a partial one (206) or an excluded
    type passes as it is."""

    def __init__(self, app: ASGIApp, minimum_size: int, compresslevel: int) -> None:
        self.app, self.minimum_size, self.compresslevel = app, minimum_size, compresslevel

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        gzip_ok = False
        for key, value in scope["headers"]:
            if key == b"accept-encoding":  # the first one, as Starlette's Headers.get reads it
                gzip_ok = b"gzip" in value
                break
        await self.app(scope, receive, _Responder(send, gzip_ok, self).send)


class _Responder:
    """One response through `GZip`: holds its start until the first body says whether to compress."""

    __slots__ = ("_send", "_gzip_ok", "_opts", "_start", "_passing", "_bodies", "_compressor")

    def __init__(self, send: Send, gzip_ok: bool, opts: GZip) -> None:
        self._send, self._gzip_ok, self._opts = send, gzip_ok, opts
        self._start: Message | None = None
        self._passing = self._bodies = False
        self._compressor: zlib._Compress | None = None

    async def send(self, message: Message) -> None:
        if self._passing:
            await self._send(message)
            return
        kind = message["type"]
        if kind == "http.response.start":
            self._start = message
            headers = message.setdefault("headers", [])
            self._passing = message["status"] == 206 or _encoded_or_excluded(headers)
            if self._passing:
                await self._send(message)
            return
        if kind == "http.response.pathsend" and self._start is not None:  # never compressed
            self._passing = True
            await self._send(self._start)
            await self._send(message)
            return
        if kind != "http.response.body" or self._start is None:  # early hints, trailers
            await self._send(message)
            return
        body, more = message.get("body", b""), message.get("more_body", False)
        if not self._bodies:  # the first body
            if len(body) < self._opts.minimum_size and not more:
                self._passing = True
                await self._send(self._start)
                await self._send(message)
                return
            self._bodies = True
            headers = MutableHeaders(raw=self._start["headers"])
            headers.add_vary_header("Accept-Encoding")
            if self._gzip_ok:
                message["body"] = self._compress(body, more)
                headers["Content-Encoding"] = "gzip"
                if more or self._start.get("trailers", False):
                    del headers["Content-Length"]
                else:
                    headers["Content-Length"] = str(len(message["body"]))
            await self._send(self._start)
            await self._send(message)
            return
        if self._gzip_ok:
            message["body"] = self._compress(body, more)
        await self._send(message)

    def _compress(self, body: bytes, more: bool) -> bytes:
        if self._compressor is None:
            self._compressor = zlib.compressobj(self._opts.compresslevel, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
        return self._compressor.compress(body) + self._compressor.flush(zlib.Z_SYNC_FLUSH if more else zlib.Z_FINISH)


def _encoded_or_excluded(headers: list[tuple[bytes, bytes]]) -> bool:
    for key, value in headers:
        if key == b"content-encoding":
            return True
        if key == b"content-type":
            media = value.decode("latin-1").partition(";")[0].strip().lower()
            major = media.partition("/")[0] + "/*"
            if media in _EXCLUDED or major in _EXCLUDED or media.startswith("application/grpc+"):
                return True
    return False
