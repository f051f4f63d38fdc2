"""The OTLP/HTTP receiver app, fed the real recorded exports through httpx's ASGI transport and a real uvicorn."""

from __future__ import annotations

import asyncio
import gzip
import json
import socket
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import httpx
import pytest
import uvicorn
from google.rpc.status_pb2 import Status

from attrib_agent.health import SourceHealth
from attrib_agent.sources.otlp.decode import DecodeResult
from attrib_agent.sources.otlp.http_receiver import otlp_http_app

from .test_otlp_decode import ALL_BODIES, JS, PB, decode, otlp_json

pytestmark = pytest.mark.anyio
URL = "http://otlp.test/v1/traces"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Receiver:
    """The app plus everything it hands out, for assertions."""

    def __init__(self, **kwargs: Any) -> None:
        self.results: list[DecodeResult] = []
        self.raw: list[tuple[float, str, bytes, str | None]] = []
        self.health = SourceHealth("otlp_http")
        self.now = 1000.0
        kwargs.setdefault("on_raw", lambda *a: self.raw.append(a))
        self.app = otlp_http_app(self.results.append, health=self.health, clock=self.clock, **kwargs)

    def clock(self) -> float:
        self.now += 1.0
        return self.now

    def client(self) -> httpx.AsyncClient:
        return httpx.AsyncClient(transport=httpx.ASGITransport(app=self.app))


async def post(client: httpx.AsyncClient, body: Any, content_type: str = PB, encoding: str | None = None,
               **headers: str) -> httpx.Response:
    hdrs = {"Content-Type": content_type, **headers}
    if encoding:
        hdrs["Content-Encoding"] = encoding
    return await client.post(URL, content=body, headers=hdrs)


def status_of(resp: httpx.Response) -> Any:
    if resp.headers["content-type"].startswith(JS):
        return json.loads(resp.content)
    return Status.FromString(resp.content)


async def test_recorded_exports_protobuf_gzip_and_json() -> None:
    rx = Receiver()
    variants = [(b, PB, None) for b in ALL_BODIES] + [(gzip.compress(b), PB, "gzip") for b in ALL_BODIES] + [
        (otlp_json(b), JS, None) for b in ALL_BODIES]
    async with rx.client() as c:
        for body, ctype, enc in variants:
            r = await post(c, body, ctype, enc)
            assert r.status_code == 200
            if ctype == PB:
                assert (r.headers["content-type"], r.content) == (PB, b"")  # empty ExportTraceServiceResponse
            else:
                assert (r.headers["content-type"], r.json()) == (JS, {})
    expected = [decode(b, ct, enc, ts=1001.0 + i) for i, (b, ct, enc) in enumerate(variants)]
    assert rx.results == expected
    assert rx.raw == [(1001.0 + i, ct, b, enc) for i, (b, ct, enc) in enumerate(variants)]  # journaled raw
    assert rx.health.ok_total == len(variants) and not rx.health.skipped and not rx.health.errors
    assert sum(len(r.spans) for r in rx.results) == 3 * (20 + 21 + 22 + 23)


@pytest.mark.parametrize("body,ctype,enc,code,kind", [
    (b"\xff\xfe garbage", PB, None, 400, "malformed"),
    (b"{not json", JS, None, 400, "malformed"),
    (b"\x1f\x8bnot gzip", PB, "gzip", 400, "malformed"),
    (ALL_BODIES[3], "text/plain", None, 415, "unsupported_media_type"),
    (ALL_BODIES[3], PB, "br", 415, "unsupported_media_type"),
    (gzip.compress(b"\0" * (16 * 1024 * 1024), 1), PB, "gzip", 413, "too_large"),  # a gzip bomb
])
async def test_bad_requests_answered_with_status_counted_and_receiver_keeps_serving(
        body: bytes, ctype: str, enc: str | None, code: int, kind: str) -> None:
    rx = Receiver(max_body=1024 * 1024)
    async with rx.client() as c:
        r = await post(c, body, ctype, enc)
        assert r.status_code == code
        status = status_of(r)
        message = status["message"] if isinstance(status, dict) else status.message
        assert message and "cmpl-" not in message
        assert rx.health.skipped == {kind: 1} and not rx.results and rx.health.ok_total == 0
        assert (await post(c, ALL_BODIES[3])).status_code == 200
    assert rx.health.ok_total == 1 and len(rx.results[0].spans) == 10


async def test_json_request_gets_json_status() -> None:
    rx = Receiver()
    async with rx.client() as c:
        r = await post(c, otlp_json(ALL_BODIES[3])[:-40], JS)
    assert r.status_code == 400 and r.headers["content-type"] == JS
    assert r.json()["code"] == 3 and "invalid JSON" in r.json()["message"]


async def test_oversized_declared_length_is_refused_before_reading() -> None:
    rx = Receiver(max_body=4096)
    async with rx.client() as c:
        r = await post(c, ALL_BODIES[3])  # 5,905 bytes > 4,096
        assert r.status_code == 413 and Status.FromString(r.content).code == 8
        assert rx.health.skipped == {"too_large": 1} and rx.raw == []


async def test_oversized_streamed_body_is_refused_without_reading_it_all() -> None:
    pulled = 0

    async def chunks() -> AsyncIterator[bytes]:
        nonlocal pulled
        for _ in range(1000):
            pulled += 1
            yield b"\0" * 1024

    rx = Receiver(max_body=8 * 1024)
    async with rx.client() as c:
        r = await c.post(URL, content=chunks(), headers={"Content-Type": PB})  # chunked: no Content-Length
    assert r.status_code == 413 and rx.health.skipped == {"too_large": 1}
    assert pulled <= 10  # stopped just past the limit, not after all 1,000 KiB


async def test_sink_failure_is_500_and_counted() -> None:
    calls = 0

    def sink(result: DecodeResult) -> None:
        nonlocal calls
        calls += 1
        if calls == 1:
            raise RuntimeError("downstream bug")

    health = SourceHealth("otlp_http")
    app = otlp_http_app(sink, health=health)
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as c:
        assert (await post(c, ALL_BODIES[3])).status_code == 500
        assert (await post(c, ALL_BODIES[3])).status_code == 200
    assert health.errors == {"sink": 1} and health.ok_total == 1 and health.up


async def test_journal_failure_still_delivers() -> None:
    def broken_journal(*args: Any) -> None:
        raise OSError("disk full")

    rx = Receiver(on_raw=broken_journal)
    async with rx.client() as c:
        assert (await post(c, ALL_BODIES[3])).status_code == 200
    assert rx.health.errors == {"journal": 1} and len(rx.results) == 1


async def test_wrong_method_and_path() -> None:
    rx = Receiver()
    async with rx.client() as c:
        assert (await c.get(URL)).status_code == 405
        assert (await c.post("http://otlp.test/v1/metrics", content=b"x")).status_code == 404


@pytest.fixture
def uvicorn_url() -> Iterator[tuple[str, Receiver]]:
    """A real uvicorn on 127.0.0.1, port 0, in its own thread and event loop."""
    import threading

    rx = Receiver(max_body=64 * 1024)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(rx.app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}/v1/traces", rx
    server.should_exit = True
    thread.join(5)
    sock.close()


def test_real_uvicorn_round_trip_and_oversize(uvicorn_url: tuple[str, Receiver]) -> None:
    url, rx = uvicorn_url
    with httpx.Client(trust_env=False, timeout=10) as c:
        for body in ALL_BODIES:
            r = c.post(url, content=gzip.compress(body), headers={"Content-Type": PB, "Content-Encoding": "gzip"})
            assert r.status_code == 200 and r.content == b""
        assert c.post(url, content=ALL_BODIES[3][:-7], headers={"Content-Type": PB}).status_code == 400
        try:  # the server answers 413 at once and may close before the client has written everything
            r = c.post(url, content=b"\0" * (256 * 1024), headers={"Content-Type": PB})
            assert r.status_code == 413
        except httpx.TransportError:
            pass
    with httpx.Client(trust_env=False, timeout=10) as c:
        assert c.post(url, content=ALL_BODIES[3], headers={"Content-Type": PB}).status_code == 200
    ids = [[s.request_id for s in r.spans] for r in rx.results]
    assert ids == [[s.request_id for s in decode(b).spans] for b in [*ALL_BODIES, ALL_BODIES[3]]]
    assert rx.health.skipped == {"malformed": 1, "too_large": 1}


async def test_receiver_keeps_an_idle_connection_past_the_sdk_export_interval() -> None:
    """OTel SDKs send a batch every 5 s on one kept-alive connection: the receiver must not close it at 5 s
    (uvicorn's default), or the next batch meets a reset connection and is lost."""
    from attrib_agent.config.load import AgentConfig
    from attrib_agent.sources.otlp.source import OtlpSource
    from attrib_agent.sources.source import SourceContext

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    health = SourceHealth("otlp")
    source = OtlpSource(AgentConfig(otlp_http_port=port, otlp_grpc_port=0),
                        SourceContext(health=lambda _n: health, clock=time.time, adopt_health=lambda _h: None))
    got: list[object] = []
    stop = asyncio.Event()
    task = asyncio.create_task(source.run(got.append, stop))
    await asyncio.wait_for(source.started.wait(), 10)
    body = ALL_BODIES[3]
    request = (f"POST /v1/traces HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: {PB}\r\n"
               f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for i in range(2):  # the same connection, 6 s apart
            if i:
                await asyncio.sleep(6)  # past uvicorn's 5 s default keep-alive
            writer.write(request)
            await writer.drain()
            status = await asyncio.wait_for(reader.readline(), 10)
            assert status.startswith(b"HTTP/1.1 200"), status
            while (await reader.readline()) not in (b"\r\n", b""):
                pass
    finally:
        writer.close()
        stop.set()
        await source.aclose()
        await asyncio.wait_for(task, 10)
    assert len(got) == 2 * len(decode(body).spans)
