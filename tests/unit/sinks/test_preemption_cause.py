"""`preemption` reaches every output for a victim vLLM preempted: preempt's w3, stalled 2-5 s mid-stream (the
client saw it skip 428 of the others' tokens) while w1 and w2 held the pool, then recomputed."""

from __future__ import annotations

from functools import cache

from api_replayed import call, replayed, state_of
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.cli.report import explain_table
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.otel.spans import SlowdownSpans
from attrib_agent.sinks.prometheus.collector import registry_for


@cache
def victim() -> AttributionResult:
    return next(r for r in replayed("preempt").store if r.request_id.endswith("-w3-0"))


def test_the_api_and_explain_name_preemption_with_its_evidence() -> None:
    body = call(api_app(state_of(replayed("preempt"))), f"/v1/requests/{victim().request_id}/culprits").json()
    assert body["preempted_s"] > 1.0
    for c in body["culprits"]:
        assert max(c["itl_causes"], key=c["itl_causes"].get) == "preemption"
    assert body["evidence"]["preemption"] == "observed_preemption"
    table = explain_table(body)
    assert "preemption" in table and "(observed_preemption)" in table and "preempted by vLLM" in table


def test_the_slowdown_span_links_carry_preemption() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    p = replayed("preempt")
    SlowdownSpans(provider).emit_all([victim()], p.span_of, p.timeline)
    provider.shutdown()
    (span,) = exporter.get_finished_spans()
    assert (span.attributes or {})["attrib.top_cause"] == "preemption"
    assert [(link.attributes or {})["attrib.cause"] for link in span.links] == ["preemption"] * len(victim().culprits)


def test_the_prometheus_cause_label_counts_preemption_seconds() -> None:
    p = replayed("preempt")
    text = generate_latest(registry_for(state_of(p))).decode()
    (family,) = [f for f in text_string_to_metric_families(text) if f.name == "attrib_attributed_slowdown_seconds"]
    got = sum(s.value for s in family.samples if s.labels.get("cause") == "preemption")
    expected = sum(c.blame_by_cause(r.itl_gaps).get("preemption", 0.0) for r in p.store if r.final
                   for c in r.culprits)
    assert got > 1.0 and abs(got - expected) < 1e-6 * max(expected, 1.0)
    assert {s.labels["phase"] for s in family.samples if s.labels.get("cause") == "preemption" and s.value > 0} \
        == {"itl"}  # w3 was preempted after its first token
