"""The OTLP forwarder: recorded exports reach a second in-process receiver byte-identical; a dead or stalled
downstream never blocks intake, and what is lost is counted."""

from __future__ import annotations

import asyncio
import gzip
import socket
import time

import httpx
import pytest
from grpc import aio

from attrib_agent.health import SourceHealth
from attrib_agent.sources.otlp.decode import DecodeResult
from attrib_agent.sources.otlp.forward import OtlpForwarder
from attrib_agent.sources.otlp.grpc_receiver import OtlpGrpcReceiver
from attrib_agent.sources.otlp.http_receiver import otlp_http_app

from .test_otlp_decode import ALL_BODIES, JS, PB, decode, otlp_json

pytestmark = pytest.mark.anyio
URL = "http://collector.test/v1/traces"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Downstream:
    """A second receiver standing in for the user's collector; it keeps exactly what arrived."""

    def __init__(self) -> None:
        self.raw: list[tuple[str, bytes, str | None]] = []
        self.results: list[DecodeResult] = []
        self.health = SourceHealth("downstream")

    def on_raw(self, ts: float, content_type: str, body: bytes, encoding: str | None) -> None:
        self.raw.append((content_type, body, encoding))

    def http_transport(self) -> httpx.ASGITransport:
        return httpx.ASGITransport(app=otlp_http_app(self.results.append, health=self.health, on_raw=self.on_raw))

    def grpc_receiver(self) -> OtlpGrpcReceiver:
        return OtlpGrpcReceiver(self.results.append, port=0, health=self.health, on_raw=self.on_raw)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Stalled(httpx.AsyncBaseTransport):
    """A downstream that accepts the connection and never answers."""

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


VARIANTS = [(b, PB, None) for b in ALL_BODIES[:5]] + [(gzip.compress(b), PB, "gzip") for b in ALL_BODIES[:5]] + [
    (otlp_json(b), JS, None) for b in ALL_BODIES[:5]]


async def test_http_intake_forwards_every_variant_byte_identical() -> None:
    down = Downstream()
    fwd = OtlpForwarder(URL, transport=down.http_transport())
    up_health = SourceHealth("otlp_http")
    upstream = otlp_http_app(lambda r: None, health=up_health, forwarder=fwd)
    await fwd.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=upstream)) as c:
        for body, ctype, enc in VARIANTS:
            headers = {"Content-Type": ctype, **({"Content-Encoding": enc} if enc else {})}
            assert (await c.post("http://agent.test/v1/traces", content=body, headers=headers)).status_code == 200
        bad = await c.post("http://agent.test/v1/traces", content=b"\xff\xff", headers={"Content-Type": PB})
        assert bad.status_code == 400  # refused here, so not forwarded
    await fwd.stop()
    assert down.raw == [(ctype, body, enc) for body, ctype, enc in VARIANTS]
    assert fwd.health.ok_total == len(VARIANTS) and not fwd.health.errors and not fwd.health.skipped
    assert down.health.ok_total == len(VARIANTS) and up_health.ok_total == len(VARIANTS)


async def test_grpc_intake_forwards_to_grpc_and_http_byte_identical() -> None:
    grpc_down, http_down = Downstream(), Downstream()
    grpc_rx = grpc_down.grpc_receiver()
    await grpc_rx.start()
    to_grpc = OtlpForwarder(grpc_rx.target, protocol="grpc")
    to_http = OtlpForwarder(URL, transport=http_down.http_transport())
    await to_grpc.start()
    await to_http.start()
    for fwd in (to_grpc, to_http):
        upstream = OtlpGrpcReceiver(lambda r: None, port=0, health=SourceHealth("otlp_grpc"), forwarder=fwd)
        await upstream.start()
        async with aio.insecure_channel(upstream.target) as channel:
            export = channel.unary_unary("/opentelemetry.proto.collector.trace.v1.TraceService/Export")
            for body in ALL_BODIES:
                await export(body, timeout=10)
        await upstream.stop()
        await fwd.stop()
    await grpc_rx.stop()
    assert grpc_down.raw == http_down.raw == [(PB, b, None) for b in ALL_BODIES]
    assert to_grpc.health.ok_total == to_http.health.ok_total == len(ALL_BODIES)


async def test_json_and_gzip_bodies_are_re_encoded_for_a_grpc_downstream() -> None:
    down = Downstream()
    rx = down.grpc_receiver()
    await rx.start()
    fwd = OtlpForwarder(f"http://{rx.target}", protocol="grpc")
    await fwd.start()
    for body, ctype, enc in VARIANTS:
        assert fwd.submit(body, ctype, enc)
    assert fwd.submit(b"{broken", JS, None)  # accepted into the queue, then found unconvertible
    await fwd.stop()
    await rx.stop()
    assert [b for _, b, _ in down.raw] == [b for b in ALL_BODIES[:5]] * 3
    ids = [[s.request_id for s in r.spans] for r in down.results]
    assert ids == [[s.request_id for s in decode(b).spans] for b in ALL_BODIES[:5]] * 3
    assert fwd.health.ok_total == len(VARIANTS) and fwd.health.skipped == {"unconvertible": 1}


async def test_dead_downstream_neither_blocks_nor_crashes_intake() -> None:
    dead = f"http://127.0.0.1:{free_port()}/v1/traces"
    fwd = OtlpForwarder(dead, queue_limit=1000, timeout_s=2.0)
    health = SourceHealth("otlp_http")
    app = otlp_http_app(lambda r: None, health=health, forwarder=fwd)
    await fwd.start()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app)) as c:
        t0 = time.monotonic()
        for body in ALL_BODIES:
            assert (await c.post("http://agent.test/v1/traces", content=body,
                                 headers={"Content-Type": PB})).status_code == 200
        intake_s = time.monotonic() - t0
    await fwd.stop(drain_s=5.0)
    assert health.ok_total == len(ALL_BODIES) and intake_s < 5.0
    assert fwd.health.errors == {"refused": len(ALL_BODIES)} and fwd.health.ok_total == 0 and not fwd.health.up


async def test_dead_grpc_downstream_counts_unavailable() -> None:
    fwd = OtlpForwarder(f"127.0.0.1:{free_port()}", protocol="grpc", timeout_s=2.0)
    await fwd.start()
    for body in ALL_BODIES[:3]:
        assert fwd.submit(body, PB, None)
    await fwd.stop(drain_s=10.0)
    assert sum(fwd.health.errors.values()) == 3 and set(fwd.health.errors) <= {"grpc_unavailable",
                                                                               "grpc_deadline_exceeded"}


async def test_stalled_downstream_queue_is_bounded_and_stop_drops_the_rest() -> None:
    fwd = OtlpForwarder(URL, transport=Stalled(), queue_limit=4, timeout_s=60.0)
    await fwd.start()
    t0 = time.monotonic()
    accepted = [fwd.submit(b, PB, None) for b in ALL_BODIES[:12]]
    assert time.monotonic() - t0 < 0.1  # submit never waits on the downstream
    await asyncio.sleep(0.05)  # the worker takes one export and hangs on it
    accepted += [fwd.submit(b, PB, None) for b in ALL_BODIES[:3]]
    assert fwd.queued <= 4 and accepted.count(False) == fwd.health.skipped["queue_full"] > 0
    t0 = time.monotonic()
    await fwd.stop(drain_s=0.2)
    assert time.monotonic() - t0 < 2.0
    assert fwd.health.skipped["dropped_at_stop"] == 5 and fwd.queued == 0  # 4 queued + 1 cut short
    assert not fwd.submit(ALL_BODIES[0], PB, None) and fwd.health.skipped["stopped"] == 1


async def test_queue_is_bounded_in_bytes_too() -> None:
    fwd = OtlpForwarder(URL, transport=Stalled(), queue_limit=1000, queue_bytes_limit=10_000)
    big = ALL_BODIES[3]  # 5,905 bytes: one fits, a second would not
    assert fwd.submit(big, PB, None) and not fwd.submit(big, PB, None)
    assert fwd.health.skipped == {"queue_full": 1}
    await fwd.start()
    await fwd.stop(drain_s=0.1)


async def test_downstream_errors_are_counted_by_kind() -> None:
    answers = iter([503, 400, 200])

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.headers["authorization"] == "Bearer t"
        return httpx.Response(next(answers))

    fwd = OtlpForwarder(URL, transport=httpx.MockTransport(handler), headers={"Authorization": "Bearer t"})
    await fwd.start()
    for body in ALL_BODIES[:3]:
        fwd.submit(body, PB, None)
    await fwd.stop()
    assert fwd.health.errors == {"http_5xx": 1, "http_4xx": 1} and fwd.health.ok_total == 1


def test_submit_from_another_thread_and_bad_protocol() -> None:
    with pytest.raises(ValueError):
        OtlpForwarder(URL, protocol="http/json")  # type: ignore[arg-type]
    got: list[bytes] = []

    def handler(request: httpx.Request) -> httpx.Response:
        got.append(request.content)
        return httpx.Response(200)

    async def main() -> None:
        fwd = OtlpForwarder(URL, transport=httpx.MockTransport(handler))
        await fwd.start()
        await asyncio.gather(*(asyncio.to_thread(fwd.submit, b, PB, None) for b in ALL_BODIES))
        await fwd.stop()

    asyncio.run(main())
    assert sorted(got) == sorted(ALL_BODIES)
