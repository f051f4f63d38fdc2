"""KvBlockLedger arithmetic and the preemption evidence, on small hand-made outcomes of the timeline's own types."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.timeline.ledger import (
    KvBlockLedger,
    KvReconciliation,
    MetricsSample,
    block_seconds,
    residual_stats,
)
from attrib_agent.timeline.model import RequestLifecycle, StepRecord
from attrib_agent.timeline.preemption import infer_preemptions, preemption_counts
from attrib_agent.timeline.sched_state import Geometry, StepInput
from attrib_agent.timeline.step_outcome import PreemptionSighting, ResumeSighting, StepOutcome

GEO = Geometry(block_size=16, num_blocks=11)  # 10 usable blocks


def step(seq: int, end: float, holdings: dict[str, int], kv_blocks: float | None = None,
         preemptions: tuple[PreemptionSighting, ...] = (), resumes: tuple[ResumeSighting, ...] = ()
         ) -> tuple[StepInput, StepOutcome]:
    used = sum(holdings.values())
    observed = float(used) if kv_blocks is None else kv_blocks
    si = StepInput(seq, 0, 100 + seq, end, 0.01, 0, 0, len(holdings), len(holdings), observed / 10)
    rec = StepRecord(0, 100 + seq, end, 0.01, 0, 0, len(holdings), len(holdings), observed / 10)
    return si, StepOutcome(rec, (), preemptions, resumes, tuple(holdings.items()), used, observed)


def test_block_seconds_integrate_holdings_between_step_ends() -> None:
    steps = [step(0, 10.0, {"a": 2}), step(1, 11.0, {"a": 2, "b": 1}), step(2, 13.0, {"b": 3}), step(3, 14.0, {})]
    ledger = KvBlockLedger(GEO, steps, [], {"a": (9.99, 11.0), "b": (10.5, 14.0)})
    a, b = ledger.request("a"), ledger.request("b")
    assert a is not None and b is not None
    assert a.block_seconds == pytest.approx(2 * 1.0 + 2 * 2.0) and a.peak_blocks == 2
    assert b.block_seconds == pytest.approx(1 * 2.0 + 3 * 1.0) and b.peak_blocks == 3
    assert a.mean_share == pytest.approx(6.0 / (10 * (11.0 - 9.99)), rel=1e-6)
    assert b.mean_share == pytest.approx(5.0 / (10 * 3.5))
    assert [r.request_id for r in ledger.requests()] == ["a", "b"]
    assert ledger.held_at(12.0) == {"a": 2, "b": 1} and ledger.held_at(5.0) == {}
    assert ledger.blocks("b", 102) == 3 and ledger.blocks("a", 102) == 0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.dictionaries(st.sampled_from("abcd"), st.integers(0, 9), max_size=4), min_size=1, max_size=12),
       st.lists(st.floats(0.001, 3.0), min_size=12, max_size=12), st.sets(st.sampled_from("abcdz")))
def test_block_seconds_of_some_requests_are_the_ledgers_figures(holdings: list[dict[str, int]], gaps: list[float],
                                                                 wanted: set[str]) -> None:
    """What an attribution pass reads for its culprits instead of the whole ledger: the same sums, bit for bit;
    requests that held nothing (or are unknown) are absent, as the ledger has no entry for them."""
    ends = [10.0 + sum(gaps[: k + 1]) for k in range(len(holdings))]
    steps = [step(k, end, h) for k, (end, h) in enumerate(zip(ends, holdings, strict=True))]
    ledger = KvBlockLedger(GEO, steps, [], {})
    got = block_seconds(steps, wanted)
    assert got == {r: kv.block_seconds for r in wanted if (kv := ledger.request(r)) is not None}


def test_metrics_samples_reconcile_with_the_step_whose_state_they_show() -> None:
    steps = [step(0, 10.00, {"a": 2}), step(1, 10.05, {"a": 3}, kv_blocks=4.0), step(2, 10.20, {"a": 3})]
    samples = [MetricsSample(10.06, 0.3, None), MetricsSample(10.07, 0.2, None), MetricsSample(9.0, 0.0, None),
               MetricsSample(10.5, None, None)]
    recs = KvBlockLedger(GEO, steps, samples, {}).reconciliations()
    assert [(r.iteration, r.predicted_blocks) for r in recs] == [(101, 3), (100, 2)]
    assert recs[0].residual == pytest.approx(0.0) and recs[1].residual == pytest.approx(0.0)
    assert KvBlockLedger(Geometry(), steps, samples, {}).reconciliations() == []
    per_step = KvBlockLedger(GEO, steps, samples, {}).step_reconciliations()
    assert [r.residual for r in per_step] == [0.0, 1.0, 0.0]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.floats(-50, 50, allow_nan=False), max_size=40))
def test_residual_stats_are_order_statistics_of_the_absolute_residuals(values: list[float]) -> None:
    recs = [KvReconciliation(float(i), i, v, 0) for i, v in enumerate(values)]
    stats = residual_stats(recs)
    assert stats.n == len(values)
    if values:
        absolute = sorted(abs(v) for v in values)
        assert stats.median_abs in absolute and stats.p95_abs in absolute
        assert stats.median_abs <= stats.p95_abs <= stats.max_abs == absolute[-1]


def _preempted_run(counter_rises: bool) -> tuple[list[tuple[StepInput, StepOutcome]], list[MetricsSample]]:
    sighting = PreemptionSighting("v", 1, 101, 10.95, True, 64, 4)
    resume = ResumeSighting("v", 3, 103, 13.0, 1)
    steps = [step(0, 10.0, {"a": 5, "v": 4}, kv_blocks=9.0), step(1, 11.0, {"a": 6}, preemptions=(sighting,)),
             step(2, 12.0, {"a": 6}), step(3, 13.0, {"a": 6, "v": 4}, resumes=(resume,))]
    total = 1.0 if counter_rises else 0.0
    samples = [MetricsSample(9.5, 0.9, 0.0), MetricsSample(12.5, 0.6, 0.0), MetricsSample(13.5, 1.0, total)]
    return steps, samples


def test_a_preemption_with_all_the_evidence_is_near_certain() -> None:
    steps, samples = _preempted_run(counter_rises=True)
    lc = RequestLifecycle("v", arrival_ts=9.0, first_token_ts=9.9, finish_ts=13.0, completion_tokens=2, complete=True)
    (p,) = infer_preemptions(steps, samples, {"v": lc})
    assert (p.request_id, p.preempted_iteration, p.resumed_iteration) == ("v", 101, 103)
    assert set(p.evidence) == {"count_gap", "kv_pressure", "kv_drop", "resumed", "counter_rise", "lifecycle_gap"}
    assert p.confidence > 0.99
    counts = preemption_counts([p], samples)
    assert (counts.inferred, counts.counted_by_vllm, counts.matched_to_counter) == (1, 1.0, 1)


def test_a_counter_that_saw_the_resumption_and_did_not_rise_counts_against() -> None:
    steps, samples = _preempted_run(counter_rises=False)
    (p,) = infer_preemptions(steps, samples, {})
    assert "counter_silent" in p.evidence and "counter_rise" not in p.evidence
    assert p.confidence < 0.5


def test_counter_resets_are_not_rises() -> None:
    samples = [MetricsSample(1.0, 0.0, 5.0), MetricsSample(2.0, 0.0, 1.0, counter_reset=True),
               MetricsSample(3.0, 0.0, 2.0)]
    assert preemption_counts([], samples).counted_by_vllm == 1.0


def test_only_a_count_gap_is_weaker_than_corroborated_and_stronger_than_contradicted() -> None:
    """Behaviour, not the constant: a lone count gap ranks between a sighting the counter contradicts and one
    every source corroborates, and is not called likely (a request can leave the running count by finishing)."""
    sighting = PreemptionSighting("v", 1, 101, 10.95, False, 0, 0)
    steps = [step(0, 10.0, {"v": 1}), step(1, 11.0, {}, preemptions=(sighting,))]
    (alone,) = infer_preemptions(steps, [], {})
    assert alone.evidence == ("count_gap",) and alone.resumed_iteration is None
    (contradicted,) = infer_preemptions(*_preempted_run(counter_rises=False), {})
    (corroborated,) = infer_preemptions(*_preempted_run(counter_rises=True), {})
    assert contradicted.confidence < alone.confidence < corroborated.confidence
    assert alone.confidence <= 0.5


def test_reading_only_the_eventful_steps_gives_the_same_preemptions() -> None:
    steps, samples = _preempted_run(counter_rises=True)
    lc = RequestLifecycle("v", arrival_ts=9.0, first_token_ts=9.9, finish_ts=13.0, completion_tokens=2, complete=True)
    walked = infer_preemptions(steps, samples, {"v": lc})
    assert infer_preemptions(steps, samples, {"v": lc}, in_order=True, eventful=[1, 3]) == walked
    assert infer_preemptions(steps, samples, {"v": lc}, eventful=[3]) != walked  # the index is what is read
