"""A plain keep-alive HTTP/1.1 GET for the /metrics poller: one connection, one request at a time.

At 4 polls a second httpx's client machinery (request and response models, the connection pool, h11's state
machine, its decoders) was most of the poller's CPU on the event loop; the body's own parse ~0.2 ms (the live
profile, docs/performance.md section 11). This reads the same bytes with one write and a few reads: status
line, headers, then a Content-Length body, a chunked one, or one that ends with the connection. No
Accept-Encoding is sent (vLLM's exposition answers uncompressed; a body compressed anyway is decompressed).
Only for `http://` URLs without credentials; others keep httpx (MetricsPoller decides).
"""

from __future__ import annotations

import asyncio
import zlib
from typing import Final
from urllib.parse import urlsplit

MAX_HEADER_BYTES: Final = 64 * 1024


class BadResponse(Exception):
    """The server's answer is not HTTP/1.x as this client reads it."""


class Undecodable(BadResponse):
    """A body in a content-encoding this client cannot undo."""


class Dropped(BadResponse):
    """The connection ended (reset, closed) before the whole answer came."""


class ConnectFailed(OSError):
    """No connection (refused, unreachable, unknown host)."""


class BodyTooLarge(Exception):
    pass


def plain_http(url: str) -> bool:
    """Whether `KeepAliveGet` can fetch `url` (http, no user info)."""
    parts = urlsplit(url)
    return parts.scheme == "http" and bool(parts.hostname) and parts.username is None and parts.password is None


class KeepAliveGet:
    def __init__(self, url: str) -> None:
        parts = urlsplit(url)
        self.host, self.port = parts.hostname or "", parts.port or 80
        target = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
        host = parts.netloc.rpartition("@")[2]
        self._request = f"GET {target} HTTP/1.1\r\nHost: {host}\r\nUser-Agent: attrib-agent\r\n\r\n".encode()
        self._conn: tuple[asyncio.StreamReader, asyncio.StreamWriter] | None = None
        self.connections = 0  # opened, since start (a kept one is reused)

    async def get(self, timeout_s: float, max_body: int) -> tuple[int, bytes]:
        """(status, body) of one GET within `timeout_s` (TimeoutError); a kept connection the server closed
        meanwhile is replaced once. Raises ConnectFailed, BadResponse (Dropped: reset, closed), BodyTooLarge."""
        async with asyncio.timeout(timeout_s):
            if self._conn is not None:
                try:
                    return await self._exchange(self._conn, max_body)
                except (ConnectionError, asyncio.IncompleteReadError):
                    self.close()  # closed while idle: once more on a new one
            try:
                reader, writer = await asyncio.open_connection(self.host, self.port)
            except TimeoutError:
                raise
            except OSError as e:
                raise ConnectFailed(*e.args) from e
            self.connections += 1
            self._conn = (reader, writer)
            try:
                return await self._exchange(self._conn, max_body)
            except (ConnectionError, asyncio.IncompleteReadError) as e:
                raise Dropped(type(e).__name__) from e

    async def _exchange(self, conn: tuple[asyncio.StreamReader, asyncio.StreamWriter],
                        max_body: int) -> tuple[int, bytes]:
        reader, writer = conn
        try:
            writer.write(self._request)
            status, headers = _head(await reader.readuntil(b"\r\n\r\n"))
            body = await _body(reader, headers, max_body)
        except asyncio.LimitOverrunError as e:
            self.close()
            raise BadResponse("response head too long") from e
        except BaseException:
            self.close()
            raise
        if headers.get("connection", "").lower() == "close" or "content-length" not in headers and \
                "chunked" not in headers.get("transfer-encoding", "").lower():
            self.close()
        encoding = headers.get("content-encoding", "identity").lower()
        if encoding in ("gzip", "deflate"):
            try:
                body = zlib.decompress(body, 16 + zlib.MAX_WBITS if encoding == "gzip" else zlib.MAX_WBITS)
            except zlib.error as e:
                raise Undecodable(f"undecodable {encoding} body") from e
        elif encoding != "identity":
            raise Undecodable(f"unknown content-encoding {encoding!r}")
        return status, body

    def close(self) -> None:
        if self._conn is not None:
            self._conn[1].close()
            self._conn = None


def _head(raw: bytes) -> tuple[int, dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    version, _, rest = lines[0].partition(" ")
    code = rest[:3]
    if not version.startswith("HTTP/1.") or not code.isdigit():
        raise BadResponse(f"not an HTTP/1.x status line: {lines[0][:80]!r}")
    headers = {}
    for line in lines[1:]:
        if line:
            key, sep, value = line.partition(":")
            if not sep:
                raise BadResponse("malformed header line")
            headers[key.strip().lower()] = value.strip()
    return int(code), headers


async def _body(reader: asyncio.StreamReader, headers: dict[str, str], max_body: int) -> bytes:
    if "chunked" in headers.get("transfer-encoding", "").lower():
        out = bytearray()
        while True:
            size_line = await reader.readuntil(b"\r\n")
            try:
                size = int(size_line.split(b";")[0].strip(), 16)
            except ValueError as e:
                raise BadResponse("bad chunk size") from e
            if len(out) + size > max_body:
                raise BodyTooLarge
            if size == 0:
                while (await reader.readuntil(b"\r\n")) != b"\r\n":  # trailers, then the blank line
                    pass
                return bytes(out)
            out += await reader.readexactly(size)
            await reader.readexactly(2)
    if "content-length" in headers:
        try:
            length = int(headers["content-length"])
        except ValueError as e:
            raise BadResponse("bad content-length") from e
        if length > max_body:
            raise BodyTooLarge
        return await reader.readexactly(length)
    out = bytearray()  # no length: the body ends with the connection
    while chunk := await reader.read(65536):
        out += chunk
        if len(out) > max_body:
            raise BodyTooLarge
    return bytes(out)
