"""The poller's plain keep-alive GET (sources/metrics/http_get.py) against a real socket server: the same bytes as
httpx reads, one connection reused, a connection the server closed replaced, failures by the poller's kinds."""

from __future__ import annotations

import asyncio
import gzip
import json
import lzma
from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest

from attrib_agent.health import SourceHealth
from attrib_agent.sources.metrics.http_get import KeepAliveGet, plain_http
from attrib_agent.sources.metrics.poller import MetricsPoller

RECORDED = Path(__file__).parents[2] / "fixtures/recordings/preempt-steps/metrics.jsonl.xz"
with lzma.open(RECORDED, "rt") as f:
    TEXT = json.loads(f.readline())["text"].encode()  # a real vLLM body (~50 KB)

Answer = Callable[[asyncio.StreamReader, asyncio.StreamWriter], Awaitable[None]]


async def _served(answer: Answer, go: Callable[[str], Awaitable[None]]) -> list[int]:
    """Serve `answer` to every request until `go(url)` returns; the requests seen on each connection."""
    conns: list[int] = []

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conns.append(0)
        try:
            while True:
                await reader.readuntil(b"\r\n\r\n")
                conns[-1] += 1
                await answer(reader, writer)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    async with server:
        await go(f"http://127.0.0.1:{port}/metrics")
    return conns


def _length(body: bytes, extra: bytes = b"") -> Answer:
    async def answer(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: %d\r\n%s\r\n%s"
                     % (len(body), extra, body))
    return answer


async def _chunked(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    parts = [TEXT[:1000], TEXT[1000:]]
    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
                 + b"".join(b"%x\r\n%s\r\n" % (len(p), p) for p in parts if p) + b"0\r\n\r\n")


def test_bodies_by_length_chunked_and_gzip_on_one_connection() -> None:
    got: list[tuple[int, bytes]] = []

    async def go(url: str) -> None:
        client = KeepAliveGet(url)
        for _ in range(3):
            got.append(await client.get(2.0, 1 << 20))
        client.close()

    for answer in (_length(TEXT), _chunked, _length(gzip.compress(TEXT), b"Content-Encoding: gzip\r\n")):
        assert asyncio.run(_served(answer, go)) == [3]  # one connection, three requests on it
    assert got == [(200, TEXT)] * 9


def test_a_connection_closed_by_the_server_is_replaced() -> None:
    async def once_then_close(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await _length(TEXT)(reader, writer)
        await writer.drain()
        writer.close()

    async def go(url: str) -> None:
        client = KeepAliveGet(url)
        for _ in range(3):
            assert await client.get(2.0, 1 << 20) == (200, TEXT)
            await asyncio.sleep(0.01)
        client.close()

    assert asyncio.run(_served(once_then_close, go)) == [1, 1, 1]


@pytest.mark.parametrize(("answer", "kind"), [
    (_length(b"x" * 5000), "malformed"),  # over the poller's max_body_bytes below
    (_length(b"not gzip", b"Content-Encoding: gzip\r\n"), "malformed"),
    (_length(b"", b"Bad header line\r\n"), "transport"),
    (None, "timeout"),  # no answer
])
def test_failures_are_counted_by_the_pollers_kinds(answer: Answer | None, kind: str) -> None:
    async def silent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await asyncio.sleep(5)

    async def go(url: str) -> None:
        health = SourceHealth("vllm_metrics")
        poller = MetricsPoller(url, timeout_s=0.3, max_body_bytes=4096, health=health)
        assert await poller.poll_once() == []
        assert health.errors == {kind: 1}
        await poller.aclose()

    asyncio.run(_served(answer or silent, go))


def test_refused_and_url_forms() -> None:
    async def go() -> None:
        health = SourceHealth("vllm_metrics")
        poller = MetricsPoller("http://127.0.0.1:9/metrics", timeout_s=1.0, health=health)  # discard: closed
        assert await poller.poll_once() == []
        assert health.errors == {"refused": 1}

    asyncio.run(go())
    assert plain_http("http://vllm:8000/metrics") and not plain_http("https://vllm/metrics")
    assert not plain_http("http://user:pw@vllm:8000/metrics")
