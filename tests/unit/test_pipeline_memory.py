"""What keeps the pipeline's memory flat at 100,000 results (benchmarks/memory.py): span ids are held only
until a result carries them, and culprits without causes share one empty mapping. Real recordings."""

from __future__ import annotations

import json
from pathlib import Path

from attrib_agent.attribution.result import NO_CAUSES
from attrib_agent.attribution.result_codec import from_dict, to_dict
from attrib_agent.events import RequestSpan
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[1] / "fixtures" / "recordings"


def test_span_ids_are_held_for_pending_victims_only_and_still_answered() -> None:
    p = AttributionPipeline(PipelineConfig(max_pending=10))  # shorts: 20 spans in 5 exports, none dropped
    spans: dict[str, RequestSpan] = {}
    for ev in ReplaySource(RECORDINGS / "shorts").events():
        p.feed(ev)
        if isinstance(ev, RequestSpan):
            spans[ev.request_id] = ev
        assert len(p._spans) <= 10
    p.settle()
    assert len(p.store) == len(spans) == 20 and p.dropped_pending == 0
    for r in p.store:  # results made after their span left the map still carry its ids, and span_of finds them
        span = spans[r.request_id]
        assert (r.trace_id, r.span_id) == (span.trace_id, span.span_id)
        assert p.span_of(r.request_id) == (span.trace_id, span.span_id)
    assert p.span_of("cmpl-nobody-0") is None


def test_a_final_results_span_ids_leave_the_span_map_and_are_answered_from_the_store() -> None:
    p = AttributionPipeline()  # max_pending 10,000: only the pop at the final result empties the map
    spans = {}
    for ev in ReplaySource(RECORDINGS / "preempt").events():
        p.feed(ev)
        if isinstance(ev, RequestSpan):
            spans[ev.request_id] = (ev.trace_id, ev.span_id)
        assert not any((r := p.store.get(rid)) is not None and r.final for rid in p._spans)
    p.settle()
    assert all(r.final for r in p.store) and len(p.store) == len(spans)
    assert not p._spans
    assert all(p.span_of(rid) == ids for rid, ids in spans.items())


def test_culprits_without_causes_share_one_empty_mapping_that_serialises() -> None:
    p = AttributionPipeline()
    for ev in ReplaySource(RECORDINGS / "preempt").events():
        p.feed(ev)
    p.settle()
    culprits = [c for r in p.store for c in r.culprits]
    empty = [c for c in culprits if not c.causes]
    assert empty and len(empty) < len(culprits)
    assert all(c.causes is NO_CAUSES for c in empty)
    assert NO_CAUSES == {}
    for r in p.store:
        back = from_dict(json.loads(json.dumps(to_dict(r))))
        assert back == r
        assert all(c.causes is NO_CAUSES for c in back.culprits if not c.causes)
