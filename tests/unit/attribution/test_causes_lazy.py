"""The observed causes keep a contention step as (its shares, one factor per cause) and expand a culprit's weights
only when its blame is split: every culprit expanded must account for the victim's overall seconds by cause (summed
as the steps came), with no negative weight, on real recordings."""

from __future__ import annotations

from pathlib import Path

import pytest

from attrib_agent.attribution.causes import PHASES, engine_view, observed_causes
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).resolve().parents[2] / "fixtures" / "recordings"


@pytest.mark.parametrize("name", ["bench-mixed", "whale2", "preempt"])
def test_culprits_expanded_sum_to_the_overall_by_cause(name: str) -> None:
    p = AttributionPipeline()
    p.feed_all(tuple(ReplaySource(RECORDINGS / name).events()))
    view = engine_view(p.timeline, p.attributor.scheduler_config(p.timeline), Pricer(p.attributor.cost))
    checked = 0
    for lc in p.timeline.lifecycles():
        got = observed_causes(lc, view)
        if got is None:
            continue
        weights = got.weights
        for phase in PHASES:
            summed: dict[str, float] = {}
            for culprit, by in weights[phase].items():
                assert culprit != lc.request_id
                for cause, secs in by.items():
                    assert secs > 0
                    summed[cause] = summed.get(cause, 0.0) + secs
            overall = {c: s for c, s in got._overall(phase).items() if s > 0}
            assert summed.keys() == overall.keys()
            for cause, secs in overall.items():
                assert summed[cause] == pytest.approx(secs, rel=1e-9, abs=1e-12)
                checked += 1
            for culprit in weights[phase]:  # a culprit's own split: its causes, summing to what it is given
                split = got.split(culprit, phase, 1.0)
                assert set(split) == set(weights[phase][culprit]) and sum(split.values()) == pytest.approx(1.0)
    assert checked > 0
