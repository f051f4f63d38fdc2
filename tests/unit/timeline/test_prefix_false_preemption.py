"""Shared-prefix traffic in which vLLM preempted nothing (recordings/bench-prefix-steps, `vllm bench serve
--dataset-name prefix_repetition` with the step plugin): the step inference must keep every request in the steps
vLLM ran it in, so nothing is taken for preempted, counted, or blamed as a `preemption` cause."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from attrib_agent.events import Event
from attrib_agent.lab.step_truth import score_recording
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline import EngineTimeline
from attrib_agent.vllm_ids import external_id

RECORDING = Path(__file__).parents[2] / "fixtures" / "recordings" / "bench-prefix-steps"


@cache
def events() -> tuple[Event, ...]:
    return tuple(ReplaySource(RECORDING).events())


def test_vllm_preempted_nothing_in_the_recording() -> None:
    rec = Recording(RECORDING)
    steps = [m for m in rec.records(VLLM_STEPS) if m.get("kind") == "step"]
    assert len(steps) > 500 and not any(m["preempted"] for m in steps)
    assert rec.meta["preemptions"] == 0.0
    # the step that exposed it: four admitted at once, three of them hitting 768 cached tokens
    assert sum(1 for m in steps for s in m["scheduled"] if s.get("hit") == 768) >= 3


def test_the_replayed_timeline_infers_no_preemption_and_every_step_has_vllms_members() -> None:
    tl = EngineTimeline()
    tl.feed_all(events())
    assert tl.preemptions() == []
    assert tl.preemption_counts().inferred == 0
    s = score_recording(RECORDING)
    assert s is not None and s.steps_in_timeline == s.steps
    assert s.preempted_named == 0
    assert s.membership_share is not None and s.membership_share >= 0.99  # main: 0 %, two requests lost at step 2
    assert s.block_exact_share is not None and s.block_exact_share >= 0.95


def test_the_pipeline_counts_no_preemption_and_blames_none() -> None:
    p = AttributionPipeline()
    results = [*p.feed_all(list(events())), *p.settle()]
    assert results
    assert p.preemptions_inferred == 0
    assert all(r.preempted_s == 0.0 for r in results)
    assert not any(c.causes.get("preemption", 0.0) > 0 for r in results for c in r.culprits)


def test_prefix_hits_are_placed_where_vllm_found_them() -> None:
    """Requests admitted with the first of a new prefix: vLLM caches blocks at allocation, so the first computes
    the prefix and the later ones hit it, in whole blocks; the line shows only the total computed. Shared evenly,
    7 of the 60 were wrong (576 each where vLLM had 0, 768, 768, 768; 725 where it had 768, 768, 640)."""
    truth: dict[str, int] = {}
    for m in Recording(RECORDING).records(VLLM_STEPS):
        for s in m.get("scheduled", ()) if m.get("kind") == "step" else ():
            truth.setdefault(external_id(s["id"]), int(s.get("hit") or 0))  # found at admission: its first step
    tl = EngineTimeline()
    tl.feed_all(events())
    assert {lc.request_id for lc in tl.lifecycles()} == set(truth)
    assert sum(h > 0 for h in truth.values()) >= 40 and len(set(truth.values())) >= 3
    assert {rid: tl.cached_tokens(rid) for rid in truth} == truth
