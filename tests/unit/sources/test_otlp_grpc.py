"""The OTLP/gRPC receiver on a real grpc.aio server over loopback, fed the real recorded exports."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import grpc
import grpc.aio
import pytest
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from attrib_agent.health import SourceHealth
from attrib_agent.sources.otlp.decode import DecodeResult
from attrib_agent.sources.otlp.forward import GRPC_EXPORT_METHOD
from attrib_agent.sources.otlp.grpc_receiver import OtlpGrpcReceiver

from .test_otlp_decode import ALL_BODIES, PB, decode

pytestmark = pytest.mark.anyio
MAX = 64 * 1024


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def TraceServiceStub(channel: grpc.aio.Channel) -> Any:  # noqa: N802 - stands in for the generated class
    """The generated client stub, exactly as an OTLP exporter uses it (the generated module is untyped)."""
    return trace_service_pb2_grpc.TraceServiceStub(channel)  # type: ignore[no-untyped-call]


class Collected:
    def __init__(self) -> None:
        self.results: list[DecodeResult] = []
        self.raw: list[tuple[float, str, bytes, str | None]] = []
        self.health = SourceHealth("otlp_grpc")
        self.now = 2000.0

    def clock(self) -> float:
        self.now += 1.0
        return self.now

    def receiver(self, **kwargs: Any) -> OtlpGrpcReceiver:
        kwargs.setdefault("max_message_bytes", MAX)
        return OtlpGrpcReceiver(self.results.append, port=0, health=self.health, clock=self.clock,
                                on_raw=lambda *a: self.raw.append(a), **kwargs)


@pytest.fixture
async def served() -> AsyncIterator[tuple[Collected, OtlpGrpcReceiver, grpc.aio.Channel]]:
    got = Collected()
    rx = got.receiver()
    await rx.start()
    async with grpc.aio.insecure_channel(rx.target) as channel:
        yield got, rx, channel
    await rx.stop()


async def test_recorded_exports_through_trace_service_stub(served: Any) -> None:
    got, rx, channel = served
    assert rx.port > 0
    stub = TraceServiceStub(channel)
    for body in ALL_BODIES:
        resp = await stub.Export(ExportTraceServiceRequest.FromString(body), timeout=10)
        assert resp.ByteSize() == 0  # an empty ExportTraceServiceResponse: all accepted
    for body in ALL_BODIES:  # gzip transport compression, as an exporter with compression=gzip sends
        await stub.Export(ExportTraceServiceRequest.FromString(body), timeout=10, compression=grpc.Compression.Gzip)
    bodies = ALL_BODIES * 2
    assert got.results == [decode(b, ts=2001.0 + i) for i, b in enumerate(bodies)]
    assert got.raw == [(2001.0 + i, PB, b, None) for i, b in enumerate(bodies)]  # byte-identical journal
    assert got.health.ok_total == len(bodies) and not got.health.skipped
    ids = {s.request_id for r in got.results for s in r.spans}
    assert len(ids) == 20 + 21 + 22 + 23


async def test_garbage_truncated_oversized_and_bomb_are_refused_counted_and_serving_goes_on(served: Any) -> None:
    got, rx, channel = served
    raw = channel.unary_unary(GRPC_EXPORT_METHOD)  # bytes as they are, no serializer
    padding = b"\xfa\x06" + b"\x80\x80\x08" + b"\0" * (128 * 1024)  # a 128 KiB unknown field (111) of zeros
    bomb = b"\xfa\x06" + b"\x80\x80\x80\x04" + b"\0" * (8 * 1024 * 1024)  # 8 MiB of zeros, ~8 KiB gzipped
    cases = [
        (b"\xff\xff\xff\xff", None, grpc.StatusCode.INVALID_ARGUMENT),
        (ALL_BODIES[3][:-7], None, grpc.StatusCode.INVALID_ARGUMENT),
        (ALL_BODIES[3] + padding, None, grpc.StatusCode.RESOURCE_EXHAUSTED),
        (ALL_BODIES[3] + bomb, grpc.Compression.Gzip, grpc.StatusCode.RESOURCE_EXHAUSTED),
    ]
    for body, compression, code in cases:
        with pytest.raises(grpc.aio.AioRpcError) as e:
            await raw(body, timeout=10, compression=compression)
        assert e.value.code() == code and "cmpl-" not in (e.value.details() or "")
    assert got.health.skipped == {"malformed": 2, "too_large": 2} and got.results == []
    await TraceServiceStub(channel).Export(ExportTraceServiceRequest.FromString(ALL_BODIES[3]), timeout=10)
    assert got.health.ok_total == 1 and len(got.results[0].spans) == 10


async def test_sink_failure_is_internal_and_counted() -> None:
    health = SourceHealth("otlp_grpc")
    calls: list[DecodeResult] = []

    def sink(result: DecodeResult) -> None:
        calls.append(result)
        if len(calls) == 1:
            raise RuntimeError("downstream bug")

    rx = OtlpGrpcReceiver(sink, port=0, health=health)
    await rx.start()
    try:
        async with grpc.aio.insecure_channel(rx.target) as channel:
            stub = TraceServiceStub(channel)
            req = ExportTraceServiceRequest.FromString(ALL_BODIES[3])
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await stub.Export(req, timeout=10)
            assert e.value.code() == grpc.StatusCode.INTERNAL
            await stub.Export(req, timeout=10)
    finally:
        await rx.stop()
    assert health.errors == {"sink": 1} and health.ok_total == 1


async def test_in_flight_calls_are_bounded() -> None:
    got = Collected()
    rx = got.receiver(max_concurrent_rpcs=2)
    await rx.start()
    hold = asyncio.Event()

    async def never_sends() -> AsyncIterator[bytes]:  # a client that opens the call and stalls
        await hold.wait()
        yield ALL_BODIES[3]

    try:
        async with grpc.aio.insecure_channel(rx.target) as channel:
            stalled = channel.stream_unary(GRPC_EXPORT_METHOD)
            calls = [stalled(never_sends(), timeout=10) for _ in range(2)]
            await asyncio.sleep(0.3)
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await channel.unary_unary(GRPC_EXPORT_METHOD)(ALL_BODIES[3], timeout=10)
            assert e.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            hold.set()
            await asyncio.gather(*calls)
    finally:
        await rx.stop()
    assert got.health.ok_total == 2


async def test_two_receivers_on_free_ports_and_restart() -> None:
    a, b = Collected().receiver(), Collected().receiver()
    await a.start()
    await b.start()
    assert a.port != b.port and a.port > 0
    await a.stop()
    await b.stop()
    await a.stop()  # idempotent


async def test_a_stalled_client_is_timed_out_and_frees_its_slot() -> None:
    got = Collected()
    rx = got.receiver(max_concurrent_rpcs=1, read_timeout_s=0.3)
    await rx.start()

    async def stalls() -> AsyncIterator[bytes]:
        await asyncio.sleep(30)
        yield b""

    try:
        async with grpc.aio.insecure_channel(rx.target) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as e:
                await channel.stream_unary(GRPC_EXPORT_METHOD)(stalls(), timeout=10)
            assert e.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
            await channel.unary_unary(GRPC_EXPORT_METHOD)(ALL_BODIES[3], timeout=10)
    finally:
        await rx.stop()
    assert got.health.skipped == {"read_timeout": 1} and got.health.ok_total == 1
