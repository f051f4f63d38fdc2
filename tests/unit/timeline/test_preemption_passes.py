"""What the timeline hands out each pass against the inference from scratch, on recordings with preemptions: the
timeline reads only the steps marked eventful, the book's own lifecycle lookup and the counter deltas by
bisection; from scratch walks every step held with a dict of every lifecycle. After every settle tick (the
pipeline's 0.25 s of event time) both name the same sightings, and the actionable list is theirs above the bar."""

from __future__ import annotations

from pathlib import Path

import pytest

from attrib_agent.pipeline import PipelineConfig
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline import EngineTimeline
from attrib_agent.timeline.preemption import ACTIONABLE_CONFIDENCE, infer_preemptions

FIXTURES = Path(__file__).parents[2] / "fixtures"


@pytest.mark.parametrize("recording", ["recordings/preempt-steps", "truth/preempt-midstream/runs/w1+w2-r0"])
def test_the_sightings_handed_out_each_pass_are_those_inferred_from_scratch(recording: str) -> None:
    cfg = PipelineConfig()
    tl = EngineTimeline()
    tick, passes, seen = None, 0, 0
    for ev in ReplaySource(FIXTURES / recording).events():
        tl.feed(ev)
        if tick is not None and ev.ts < tick:
            continue
        tick = ev.ts + cfg.settle_interval_s
        passes += 1
        lifecycles = {lc.request_id: lc for lc in tl._book.lifecycles()}  # the book's own, not completed
        scratch = infer_preemptions(tl.outcomes(), list(tl._samples), lifecycles)
        assert tl.preemptions() == scratch, passes
        assert tl.actionable_preemptions() == [p for p in scratch if p.confidence > ACTIONABLE_CONFIDENCE], passes
        seen = max(seen, len(scratch))
    assert passes > 50 and seen >= 3
