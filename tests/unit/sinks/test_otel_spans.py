"""`attrib.slowdown` spans from the real `preempt` recording, caught by the SDK's in-memory exporter."""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, replace
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import CLIENT, Recording
from attrib_agent.sinks.otel.spans import SPAN_NAME, SlowdownSpans, top_cause
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline import engine_timeline

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


@dataclass
class Replayed:
    pipeline: AttributionPipeline
    results: list[AttributionResult]  # everything feed/settle returned, partial and final, in order


@pytest.fixture(scope="module")
def preempt() -> Replayed:
    p = AttributionPipeline()
    out: list[AttributionResult] = []
    for ev in ReplaySource(RECORDINGS / "preempt").events():
        out.extend(p.feed(ev))
    out.extend(p.settle())
    return Replayed(p, out)


@pytest.fixture
def memory() -> Iterator[tuple[TracerProvider, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield provider, exporter
    provider.shutdown()


def by_victim(spans: tuple[ReadableSpan, ...]) -> dict[str, ReadableSpan]:
    return {str((s.attributes or {})["gen_ai.request.id"]): s for s in spans}


def test_each_final_slowed_victim_becomes_a_child_of_its_vllm_span_linked_to_its_culprits(
        preempt: Replayed, memory: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = memory
    spans = SlowdownSpans(provider)
    p = preempt.pipeline
    emitted = spans.emit_all(preempt.results, p.span_of, p.timeline)
    finals = [r for r in preempt.results if r.final]
    slowed = [r for r in finals if not r.no_interference]
    assert len(finals) == len(p.store) == 23 and emitted == len(slowed) == 16
    assert spans.skipped == Counter({"partial": len(preempt.results) - len(finals), "quiet": 7})  # 0 partial: absent
    got = by_victim(exporter.get_finished_spans())
    assert set(got) == {r.request_id for r in slowed}
    for r in slowed:
        s = got[r.request_id]
        trace_id, span_id = p.span_of(r.request_id) or ("", "")
        assert s.name == SPAN_NAME and s.kind is SpanKind.INTERNAL
        assert f"{s.context.trace_id:032x}" == trace_id == r.trace_id  # in vLLM's trace, under its llm_request
        assert s.parent is not None and f"{s.parent.span_id:016x}" == span_id and s.parent.is_remote
        assert r.arrival_ts is not None and s.start_time == round(r.arrival_ts * 1e9)
        assert s.end_time == round(r.finished_ts * 1e9)
        a = s.attributes or {}
        assert a["gen_ai.usage.input_tokens"] == r.prompt_tokens
        assert a["gen_ai.usage.output_tokens"] == r.completion_tokens
        assert a["attrib.victim_class"] == ("whale" if r.is_whale else "short")
        assert a["attrib.ttft.slowdown_s"] == r.ttft_slowdown_s and a["attrib.ttft.baseline_s"] == r.ttft_baseline_s
        assert a["attrib.itl.slowdown_s"] == r.itl_slowdown_s and a["attrib.unexplained_s"] == r.unexplained_ttft_s
        assert a["attrib.slowdown_s"] == pytest.approx(r.ttft_slowdown_s + r.itl_slowdown_s * r.itl_gaps)
        assert a["attrib.quality"] == r.quality and a["attrib.culprits.count"] == len(r.culprits)
        assert a["attrib.mode"] == r.mode == "inferred" and a["attrib.chosen_by"] == r.chosen_by == "share"
        top = r.top_culprit()
        assert top is not None and a["attrib.top_culprit.request_id"] == top.request_id
        assert "attrib.culprits.unlinked" not in a  # every culprit's span landed in this recording
        assert len(s.links) == len(r.culprits)
        for link, c in zip(s.links, sorted(r.culprits, key=lambda c: (c.ttft_s + c.itl_s, c.request_id),
                                           reverse=True), strict=True):
            la = link.attributes or {}
            assert la["attrib.culprit.request_id"] == c.request_id
            assert (f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}") == p.span_of(c.request_id)
            assert la["attrib.blamed.ttft_s"] == c.ttft_s and la["attrib.blamed.itl_s"] == c.itl_s
            assert la["attrib.share"] == c.share and la["attrib.culprit.is_whale"] == c.is_whale
            assert la["attrib.cause"] == top_cause(c, r.itl_gaps)
    assert spans.links_total == sum(len(r.culprits) for r in slowed) and spans.unlinked_culprits_total == 0
    # The short that queued longest, s003, against what the client saw (not the engine's earlier output): it waited
    # 4.8 s from send to first token while one whale's stream stood still over >= 90 % of that wait (vLLM preempted
    # it; re-admitted first, it held the queue's head) and the other whales, past their prefill, decoded hundreds
    # of tokens.
    s003 = got["cmpl-a11e94-s003-0"]
    causes = {str(a["attrib.culprit.request_id"]).split("-")[-2]: a["attrib.cause"]
              for a in (k.attributes or {} for k in s003.links)}
    clients = {c["spec_id"]: c for c in Recording(RECORDINGS / "preempt").records(CLIENT)}
    sent, first = clients["s003"]["actual_send_ts"], clients["s003"]["first_token_ts"]
    stalled, decoding = set(), set()
    for w in ("w1", "w2", "w3"):
        ts = clients[w]["token_ts"]
        during = bisect.bisect_left(ts, first) - bisect.bisect_right(ts, sent)
        covered = max(min(b, first) - max(a, sent) for a, b in zip(ts, ts[1:], strict=False))
        if covered >= 0.9 * (first - sent):  # its stream stood still over (nearly) all of s003's wait
            stalled.add(w)
        elif during >= 3 and clients[w]["first_token_ts"] < sent:
            decoding.add(w)
    assert len(stalled) == 1 and len(decoding) == 2 and set(causes) == stalled | decoding
    assert all(causes[w] == "head_of_line" for w in stalled)
    assert all(causes[w] == "kv_pressure" for w in decoding)  # they held the pool the queue's head needed
    assert (s003.attributes or {})["attrib.top_cause"] == causes[str((s003.attributes or {})[
        "attrib.top_culprit.request_id"]).split("-")[-2]]


def test_queue_wait_and_the_inferred_preemption_become_events(
        preempt: Replayed, memory: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = memory
    p = preempt.pipeline
    SlowdownSpans(provider).emit_all(preempt.results, p.span_of, p.timeline)
    got = by_victim(exporter.get_finished_spans())
    [pre] = p.timeline.preemptions()
    assert pre.request_id == "cmpl-a11e94-w3-0" and pre.confidence > 0.9
    for rid, s in got.items():
        lc = p.timeline.lifecycle(rid)
        assert lc is not None and lc.queue_s is not None and lc.scheduled_ts is not None
        queue = [e for e in s.events if e.name == "attrib.queue_wait"]
        assert len(queue) == 1 and (queue[0].attributes or {})["attrib.queue.wait_s"] == lc.queue_s
        assert queue[0].timestamp == round(lc.scheduled_ts * 1e9)
        preempted = [e for e in s.events if e.name == "attrib.preempted"]
        assert len(preempted) == (rid == pre.request_id)
    [event] = [e for e in got[pre.request_id].events if e.name == "attrib.preempted"]
    ea = event.attributes or {}
    assert ea["attrib.preemption.iteration"] == pre.preempted_iteration and event.timestamp == round(
        pre.preempted_ts * 1e9)
    assert tuple(ea["attrib.preemption.evidence"]) == pre.evidence  # type: ignore[arg-type]
    assert pre.resumed_ts is not None and ea["attrib.preemption.resumed_after_s"] == pytest.approx(
        pre.resumed_ts - pre.preempted_ts)


def test_emit_quiet_option_and_the_lead_call_without_a_timeline(
        preempt: Replayed, memory: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = memory
    spans = SlowdownSpans(provider, emit_quiet=True)
    finals = [r for r in preempt.results if r.final]
    assert sum(spans.emit(r, preempt.pipeline.span_of) for r in finals) == 23
    got = by_victim(exporter.get_finished_spans())
    quiet = [r for r in finals if r.no_interference]
    assert len(quiet) == 7 and all((got[r.request_id].attributes or {})["attrib.no_interference"] for r in quiet)
    assert all(not got[r.request_id].links and not got[r.request_id].events for r in quiet)
    assert spans.skipped == {}


def test_unknown_spans_are_skipped_or_left_unlinked_and_counted(
        preempt: Replayed, memory: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = memory
    p = preempt.pipeline
    victim = p.store.get("cmpl-a11e94-s003-0")
    assert victim is not None and len(victim.culprits) == 3
    spans = SlowdownSpans(provider, max_links=2)

    def only_victims(rid: str) -> tuple[str, str] | None:  # culprits' spans lost (e.g. evicted or never sent)
        return p.span_of(rid) if "-s" in rid else None

    assert spans.emit(victim, only_victims)
    [s] = exporter.get_finished_spans()
    assert not s.links and len((s.attributes or {})["attrib.culprits.unlinked"]) == 2  # type: ignore[arg-type]
    assert spans.unlinked_culprits_total == 2
    exporter.clear()
    assert spans.emit(victim, p.span_of)  # max_links bounds the links to the most blamed culprits
    [s] = exporter.get_finished_spans()
    assert len(s.links) == 2 and spans.links_total == 2
    # the result's own ids stand in when the pipeline has forgotten the span (a journal-restored result)
    assert spans.emit(victim, lambda rid: None)
    lost = replace(victim, trace_id=None, span_id=None)
    assert not spans.emit(lost, lambda rid: None)
    bad = replace(victim, trace_id="0x" + "f" * 30, span_id="00" * 8)
    assert not spans.emit(bad, lambda rid: None)
    assert not spans.emit(replace(victim, arrival_ts=None), p.span_of)
    assert not spans.emit(replace(victim, final=False), p.span_of)
    assert spans.skipped == {"no_span": 1, "bad_span_context": 1, "no_arrival": 1, "partial": 1}
    assert spans.emitted_total == 3 and len(exporter.get_finished_spans()) == 2


def test_a_failing_lookup_is_counted_never_raised(
        preempt: Replayed, memory: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    provider, exporter = memory
    victim = preempt.pipeline.store.get("cmpl-a11e94-s003-0")
    assert victim is not None

    def broken(rid: str) -> tuple[str, str] | None:
        raise RuntimeError("lookup bug")

    spans = SlowdownSpans(provider)
    assert not spans.emit(victim, broken)
    assert spans.skipped == {"error": 1} and not exporter.get_finished_spans()
    with pytest.raises(ValueError):
        SlowdownSpans(provider, max_links=-1)


def test_a_sighting_below_the_actionable_bar_is_no_span_event(
        preempt: Replayed, memory: tuple[TracerProvider, InMemorySpanExporter],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Spans carry only the preemptions counted and blamed: a lone count gap (0.5) is how a mis-inferred
    membership looks, and a trace event would send an operator after a preemption vLLM never made. The timeline
    sorts them out once (`actionable_preemptions`); spans read that list, not every sighting."""
    provider, exporter = memory
    p = preempt.pipeline
    [real] = p.timeline.preemptions()
    victims = [r.request_id for r in preempt.results if r.final and r.request_id != real.request_id]
    weak = replace(real, request_id=victims[0], confidence=0.5, evidence=("count_gap",))
    monkeypatch.setattr(engine_timeline, "infer_preemptions", lambda *_, **__: [real, weak])  # as if inferred
    timeline = engine_timeline.EngineTimeline()

    class Doubtful:
        def lifecycle(self, request_id: str) -> object:
            return p.timeline.lifecycle(request_id)

        def actionable_preemptions(self) -> list[object]:
            return timeline.actionable_preemptions()

    SlowdownSpans(provider).emit_all(preempt.results, p.span_of, Doubtful())  # type: ignore[arg-type]
    got = by_victim(exporter.get_finished_spans())
    assert victims[0] in got and real.request_id in got
    assert not [e for e in got[victims[0]].events if e.name == "attrib.preempted"]
    assert [e for e in got[real.request_id].events if e.name == "attrib.preempted"]


def test_a_victim_taken_outside_the_share_says_so_on_its_span(
        preempt: Replayed, memory: tuple[TracerProvider, InMemorySpanExporter]) -> None:
    """While the agent sheds, a visibly slowed request is attributed outside the hash sample (`chosen_by`
    "slowed"): a trace backend can tell it from the unbiased sample, as the API and /metrics can."""
    provider, exporter = memory
    spans = SlowdownSpans(provider)
    r = next(r for r in preempt.results if r.final and not r.no_interference)
    assert spans.emit(replace(r, chosen_by="slowed"), preempt.pipeline.span_of)
    (s,) = exporter.get_finished_spans()
    assert (s.attributes or {})["attrib.chosen_by"] == "slowed"
