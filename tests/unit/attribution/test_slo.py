"""Goodput by traffic shape: shape classes, SLO outcomes and the blame split of missed requests, on hand-made
results (each rule) and on a replayed recording (the pipeline feeds every final result once)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from attrib_agent.attribution.result import AttributionResult, Culprit
from attrib_agent.attribution.slo import OUTCOMES, SHAPES, SloConfig, SloTally, outcome_of, shape_of
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.sources.replay import ReplaySource
from tests.unit.sinks.api_replayed import RECORDINGS

CFG = SloConfig(ttft_s=5.0, itl_s=0.25, long_prompt_tokens=1000, long_output_tokens=200)


def result(ttft: float | None = 1.0, itl: float | None = 0.05, prompt: int | None = 100, output: int | None = 50,
           culprits: tuple[Culprit, ...] = (), unexplained_ttft: float = 0.0) -> AttributionResult:
    return AttributionResult(request_id="r", finished_ts=10.0, ttft_s=ttft, ttft_baseline_s=0.1, ttft_slowdown_s=0.0,
                             itl_s=itl, itl_baseline_s=0.05, itl_slowdown_s=0.0, culprits=culprits,
                             unexplained_ttft_s=unexplained_ttft, unexplained_itl_s=0.0, no_interference=False,
                             quality=1.0, prompt_tokens=prompt, completion_tokens=output)


@pytest.mark.parametrize(("prompt", "output", "shape"), [
    (100, 50, "siso"), (100, 200, "silo"), (1000, 199, "liso"), (5899, 1024, "lilo"), (None, 10, "unknown"),
    (10, None, "unknown")])
def test_shape_from_prompt_and_output_classes(prompt: int | None, output: int | None, shape: str) -> None:
    assert shape_of(prompt, output, CFG) == shape


@pytest.mark.parametrize(("ttft", "itl", "outcome"), [
    (1.0, 0.05, "met"), (5.0, 0.25, "met"), (5.01, 0.05, "missed_ttft"), (1.0, 0.26, "missed_itl"),
    (6.0, 0.3, "missed_both"), (None, None, "met")])
def test_outcome_against_both_budgets(ttft: float | None, itl: float | None, outcome: str) -> None:
    assert outcome_of(result(ttft, itl), CFG) == outcome


def test_missed_requests_split_their_blame_between_whales_crowd_and_unexplained() -> None:
    t = SloTally(CFG)
    whale = Culprit("w", ttft_s=3.0, itl_s=0.01, share=0.6, is_whale=True)
    crowd = Culprit("c", ttft_s=1.0, itl_s=0.0, share=0.2)
    t.add(result(ttft=6.0, output=51, culprits=(whale, crowd), unexplained_ttft=0.5))  # missed: 50 gaps
    t.add(result(ttft=1.0, culprits=(whale,)))  # met: its blame is not a miss's
    assert t.requests == {("siso", "missed_ttft"): 1, ("siso", "met"): 1}
    assert dict(t.missed_blame_s) == pytest.approx(
        {("siso", "whale"): 3.0 + 0.01 * 50, ("siso", "crowd"): 1.0, ("siso", "unexplained"): 0.5})
    with pytest.raises(ValueError, match="final"):
        t.add(replace(result(), final=False))


def test_bad_config_is_refused() -> None:
    with pytest.raises(ValueError):
        SloConfig(ttft_s=0)
    with pytest.raises(ValueError):
        SloConfig(long_prompt_tokens=0)


def test_pipeline_counts_every_final_result_once_in_closed_label_sets() -> None:
    cfg = SloConfig(ttft_s=1.0, itl_s=0.25, long_prompt_tokens=2000, long_output_tokens=64)
    p = AttributionPipeline(PipelineConfig(slo=cfg))
    p.feed_all(list(ReplaySource(RECORDINGS / "preempt").events()))  # typed: a list or tuple
    p.settle()
    slo = p.tally.slo
    finals = [r for r in p.store if r.final]
    assert sum(slo.requests.values()) == len(finals) == sum(p.tally.requests.values())
    assert {s for s, _ in slo.requests} <= set(SHAPES) and {o for _, o in slo.requests} <= set(OUTCOMES)
    missed = [r for r in finals if outcome_of(r, cfg) != "met"]
    assert missed, "preempt: the shorts queued behind the whales wait 1-5 s for their first token"
    assert slo.missed_blame_s[("siso", "whale")] > slo.missed_blame_s[("siso", "crowd")]
