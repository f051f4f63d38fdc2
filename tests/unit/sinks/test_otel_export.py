"""`tracer_provider_for` against the project's own OTLP receivers (real uvicorn, real grpc.aio) on loopback.

The receivers' decoder keeps only vLLM's `llm_request` spans, so the test parses each raw export protobuf
itself to check the `attrib.slowdown` spans: trace, parent, links, attributes and resource.
"""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import uvicorn
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span

from attrib_agent import __version__
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.otel.export import http_traces_url, tracer_provider_for
from attrib_agent.sinks.otel.spans import SPAN_NAME, SlowdownSpans
from attrib_agent.sources.otlp.decode import DecodeResult, parse_export_request
from attrib_agent.sources.otlp.grpc_receiver import OtlpGrpcReceiver
from attrib_agent.sources.otlp.http_receiver import otlp_http_app
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"
MAX = 8 * 1024 * 1024


@pytest.fixture(scope="module")
def preempt() -> tuple[AttributionPipeline, list[AttributionResult]]:
    p = AttributionPipeline()
    out: list[AttributionResult] = []
    for ev in ReplaySource(RECORDINGS / "preempt").events():
        out.extend(p.feed(ev))
    out.extend(p.settle())
    return p, out


@dataclass
class Arrived:
    """What a receiver got: the raw export requests (parsed here) and what its own decoder made of them."""

    requests: list[ExportTraceServiceRequest] = field(default_factory=list)
    decoded: list[DecodeResult] = field(default_factory=list)
    gate: threading.Event | None = None  # when set up, each export waits for it (a stalled collector)

    def on_raw(self, ts: float, content_type: str, body: bytes, encoding: str | None) -> None:
        if self.gate is not None:
            self.gate.wait(10)
        self.requests.append(parse_export_request(body, content_type=content_type, content_encoding=encoding,
                                                  max_decompressed=MAX))

    def spans(self) -> list[tuple[dict[str, AnyValue], Span]]:
        """(resource attributes, span) for every span that arrived."""
        return [({kv.key: kv.value for kv in rs.resource.attributes}, s)
                for req in self.requests for rs in req.resource_spans for ss in rs.scope_spans for s in ss.spans]


def attrs(kvs: Iterable[KeyValue]) -> dict[str, object]:
    out: dict[str, object] = {}
    for kv in kvs:
        v = kv.value
        which = str(v.WhichOneof("value"))
        out[kv.key] = [x.string_value for x in v.array_value.values] if which == "array_value" else getattr(v, which)
    return out


@pytest.fixture
def http_receiver() -> Iterator[tuple[str, Arrived]]:
    """The OTLP/HTTP receiver app on a real uvicorn, 127.0.0.1, a free port, in its own thread."""
    got = Arrived()
    app = otlp_http_app(got.decoded.append, health=SourceHealth("otlp"), on_raw=got.on_raw, max_body=MAX)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=lambda: asyncio.run(server.serve(sockets=[sock])), daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while not server.started and time.monotonic() < deadline:
        time.sleep(0.01)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}", got
    if got.gate is not None:
        got.gate.set()
    server.should_exit = True
    thread.join(5)
    sock.close()


@pytest.fixture
def grpc_receiver() -> Iterator[tuple[str, Arrived]]:
    """The OTLP/gRPC receiver on grpc.aio in its own thread and event loop."""
    got = Arrived()
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    rx = OtlpGrpcReceiver(got.decoded.append, port=0, health=SourceHealth("otlp"), on_raw=got.on_raw)
    asyncio.run_coroutine_threadsafe(rx.start(), loop).result(10)
    yield rx.target, got
    asyncio.run_coroutine_threadsafe(rx.stop(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(5)
    loop.close()


def check_arrived(got: Arrived, p: AttributionPipeline, results: list[AttributionResult]) -> None:
    slowed = {r.request_id: r for r in results if r.final and not r.no_interference}
    arrived = got.spans()
    assert len(arrived) == len(slowed) == 16
    for resource, s in arrived:
        assert resource["service.name"].string_value == "attrib-agent"
        assert resource["service.version"].string_value == __version__
        a = attrs(s.attributes)
        r = slowed[str(a["gen_ai.request.id"])]
        assert s.name == SPAN_NAME and s.kind == Span.SpanKind.SPAN_KIND_INTERNAL
        assert (s.trace_id.hex(), s.parent_span_id.hex()) == p.span_of(r.request_id)
        assert (s.start_time_unix_nano, s.end_time_unix_nano) == (round((r.arrival_ts or 0) * 1e9),
                                                                   round(r.finished_ts * 1e9))
        assert a["attrib.ttft.slowdown_s"] == r.ttft_slowdown_s and a["gen_ai.usage.input_tokens"] == r.prompt_tokens
        links = {str(attrs(k.attributes)["attrib.culprit.request_id"]): k for k in s.links}
        assert set(links) == {c.request_id for c in r.culprits}
        for c in r.culprits:
            k = links[c.request_id]
            assert (k.trace_id.hex(), k.span_id.hex()) == p.span_of(c.request_id)
            la = attrs(k.attributes)
            assert la["attrib.blamed.ttft_s"] == c.ttft_s and la["attrib.share"] == c.share
        assert [e.name for e in s.events][:1] == ["attrib.queue_wait"]
    assert sum(len(attrs(s.attributes)) for _, s in arrived) > 16 * 15
    preempted = [s for _, s in arrived if any(e.name == "attrib.preempted" for e in s.events)]
    assert [attrs(s.attributes)["gen_ai.request.id"] for s in preempted] == ["cmpl-a11e94-w3-0"]
    # pointed at an agent's own intake, these spans are passed over, never mistaken for vLLM's
    assert all(not d.spans for d in got.decoded) and sum(d.other_spans for d in got.decoded) == 16


def test_spans_with_links_reach_the_otlp_http_receiver(
        http_receiver: tuple[str, Arrived], preempt: tuple[AttributionPipeline, list[AttributionResult]]) -> None:
    url, got = http_receiver
    p, results = preempt
    provider = tracer_provider_for(url, protocol="http/protobuf", compression="gzip", headers={"x-tenant": "t1"})
    spans = SlowdownSpans(provider)
    assert spans.emit_all(results, p.span_of, p.timeline) == 16
    assert provider.force_flush(10_000)
    provider.shutdown()
    check_arrived(got, p, results)


def test_spans_with_links_reach_the_otlp_grpc_receiver(
        grpc_receiver: tuple[str, Arrived], preempt: tuple[AttributionPipeline, list[AttributionResult]]) -> None:
    target, got = grpc_receiver
    p, results = preempt
    assert ":" in target and "//" not in target  # a bare host:port, as the agent's config passes it: plaintext
    provider = tracer_provider_for(target, protocol="grpc")
    spans = SlowdownSpans(provider)
    assert spans.emit_all(results, p.span_of, p.timeline) == 16
    assert provider.force_flush(10_000)
    provider.shutdown()
    check_arrived(got, p, results)


def test_a_stalled_collector_holds_at_most_the_queue(
        http_receiver: tuple[str, Arrived], preempt: tuple[AttributionPipeline, list[AttributionResult]]) -> None:
    url, got = http_receiver
    got.gate = threading.Event()
    p, results = preempt
    provider = tracer_provider_for(url, protocol="http", max_queue_size=8)
    spans = SlowdownSpans(provider)
    emitted = sum(spans.emit_all(results, p.span_of) for _ in range(8))
    got.gate.set()
    assert provider.force_flush(10_000)
    provider.shutdown()
    arrived = len(got.spans())
    assert emitted == 128 and 1 <= arrived <= 16  # one batch in flight + a full queue; the rest dropped


def test_endpoint_and_option_checks() -> None:
    assert http_traces_url("http://collector:4318") == "http://collector:4318/v1/traces"
    assert http_traces_url("https://collector:4318/") == "https://collector:4318/v1/traces"
    assert http_traces_url("http://gw/otlp/v1/traces") == "http://gw/otlp/v1/traces"
    for bad in ("collector:4318", "ftp://x/"):
        with pytest.raises(ValueError, match="http"):
            tracer_provider_for(bad, protocol="http")
    with pytest.raises(ValueError, match="protocol"):
        tracer_provider_for("localhost:4317", protocol="thrift")
    with pytest.raises(ValueError, match="compression"):
        tracer_provider_for("localhost:4317", compression="zstd")
    with pytest.raises(ValueError, match="max_queue_size"):
        tracer_provider_for("localhost:4317", max_queue_size=0)
