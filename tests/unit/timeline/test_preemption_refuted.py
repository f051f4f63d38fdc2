"""Two guards against preemptions that never happened: the budget cap may cut only a step's last member (vLLM's
rule), and a sighting that vLLM's own counter, watched through the victim's next output, never counted is
dropped. Small hand-made inputs of the timeline's own types."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.timeline.ledger import MetricsSample
from attrib_agent.timeline.model import RequestLifecycle, StepRecord
from attrib_agent.timeline.preemption import _Deltas, infer_preemptions
from attrib_agent.timeline.sched_state import Geometry, SchedState, StepInput, Track
from attrib_agent.timeline.step_counts import Slot
from attrib_agent.timeline.step_outcome import PreemptionSighting, StepOutcome, StepWork
from attrib_agent.timeline.step_tokens import assign_tokens


def test_counted_prefills_all_compute_when_the_known_sizes_overrun_the_budget_seen() -> None:
    """vLLM's second step of a shared-prefix burst: one decode, four admitted 896-token prompts, three of
    them 768 tokens cached; 1,281 tokens, the largest step so far (so the inferred budget). Capping the known
    prompts in order left two with nothing although the line counts four context requests."""
    st = SchedState(budget=1281)
    decoding = Track("a", 0.0, 0, prompt=896, computed=896, outputs=1, cached=0)
    fresh = [Track(r, 0.0, i + 1, prompt=896) for i, r in enumerate("bcde")]
    work = StepWork(slots=[Slot(decoding, "decode", 1), *(Slot(t, "prefill", 896, admitted=True) for t in fresh)])
    si = StepInput(1, 0, 1, 10.0, 0.2, 4, 1280, 1, 1, 0.189)
    assign_tokens(st, si, Geometry(128, 96), work)
    prefills = work.slots[1:]
    assert all((s.tokens or 0) >= 1 for s in prefills)
    assert sum(s.tokens or 0 for s in prefills) == 1280
    assert sum(s.hit for s in prefills) == 4 * 896 - 1280


def test_a_real_cut_of_the_last_member_is_still_a_cut() -> None:
    st = SchedState(budget=1000)
    first, last = Track("a", 0.0, 0, prompt=600, cached=0), Track("b", 0.0, 1, prompt=900, cached=0)
    work = StepWork(slots=[Slot(first, "prefill", 600), Slot(last, "prefill", 900)])
    assign_tokens(st, StepInput(1, 0, 1, 10.0, 0.2, 2, 1000, 0, 0, 0.5), Geometry(128, 96), work)
    assert [s.tokens for s in work.slots] == [600, 400] and [s.hit for s in work.slots] == [0, 0]


def _step(seq: int, end: float, preemptions: tuple[PreemptionSighting, ...] = ()) -> tuple[StepInput, StepOutcome]:
    si = StepInput(seq, 0, seq, end, 0.01, 0, 0, 1, 1, 0.1)
    return si, StepOutcome(StepRecord(0, seq, end, 0.01, 0, 0, 1, 1, 0.1), (), preemptions)


SIGHTING = PreemptionSighting("v", 1, 1, 10.95, False, 896, 7)
STEPS = [_step(0, 10.0), _step(1, 11.0, (SIGHTING,)), _step(2, 12.0)]
FINISHED_LATER = {"v": RequestLifecycle("v", arrival_ts=9.0, first_token_ts=9.5, finish_ts=12.0,
                                        completion_tokens=40, complete=True)}


def _scrapes(totals: list[float], start: float = 10.5, every: float = 1.0) -> list[MetricsSample]:
    return [MetricsSample(start + i * every, 0.2, t) for i, t in enumerate(totals)]


def test_a_sighting_the_counter_watched_flat_through_its_next_output_is_dropped() -> None:
    assert infer_preemptions(STEPS, _scrapes([3.0, 3.0, 3.0, 3.0]), FINISHED_LATER) == []


def test_the_counter_must_have_been_watched_until_it_would_have_risen() -> None:
    (kept,) = infer_preemptions(STEPS, _scrapes([3.0, 3.0, 3.0]), FINISHED_LATER)  # one scrape after the finish
    assert kept.evidence == ("count_gap",)
    (kept,) = infer_preemptions(STEPS, _scrapes([3.0, 3.0, 3.0, 3.0], start=11.0), FINISHED_LATER)  # not before
    assert kept.request_id == "v"


def test_a_rise_a_reset_an_abort_or_no_output_seen_keeps_the_sighting() -> None:
    assert len(infer_preemptions(STEPS, _scrapes([3.0, 3.0, 4.0, 4.0]), FINISHED_LATER)) == 1
    reset = _scrapes([3.0, 3.0, 3.0, 3.0])
    reset[2] = MetricsSample(reset[2].ts, 0.2, 0.0, counter_reset=True)
    assert len(infer_preemptions(STEPS, reset, FINISHED_LATER)) == 1
    aborted = {"v": RequestLifecycle("v", arrival_ts=9.0, finish_ts=12.0, aborted_ts=12.0, complete=True)}
    assert len(infer_preemptions(STEPS, _scrapes([3.0] * 4), aborted)) == 1
    running = {"v": RequestLifecycle("v", arrival_ts=9.0, first_token_ts=9.5)}  # its span has not landed
    assert len(infer_preemptions(STEPS, _scrapes([3.0] * 4), running)) == 1
    assert len(infer_preemptions(STEPS, [], FINISHED_LATER)) == 1  # no counter (--disable-log-stats)


def test_only_corroborated_sightings_are_counted_and_blamed() -> None:
    """A lone count gap is how a mis-inferred membership looks: listed, with its confidence, but not acted on."""
    (alone,) = infer_preemptions(STEPS, [], {})
    pressured = PreemptionSighting("w", 1, 1, 10.95, True, 896, 7)
    (tight,) = infer_preemptions([_step(0, 10.0), _step(1, 11.0, (pressured,))], [], {})
    assert alone.confidence == 0.5 and tight.confidence > 0.5
    assert not alone.actionable and tight.actionable


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([None, 0.0, 1.0, 2.0]), st.booleans()), max_size=12),
       st.booleans(), st.lists(st.integers(0, 40), min_size=1, max_size=6))
def test_the_scrape_window_of_a_moment_is_found_by_bisection_as_by_the_walk(
        gaps: list[tuple[int, float | None, bool]], shuffled: bool, moments: list[int]) -> None:
    """Which counter delta holds a sighting (t0 <= ts < t1) and which one first shows an output (t0 < ts <= t1):
    the same delta as the walk over all of them, with tied, reset, counter-less and out-of-order scrapes."""
    ts, samples = 0.0, []
    for gap, total, reset in gaps:
        ts += gap * 0.5
        samples.append(MetricsSample(ts, None, total, reset))
    if shuffled:
        samples.reverse()
    watch = _Deltas(samples)
    deltas = watch.deltas
    for m in moments:
        t = m * 0.25
        assert watch.holding(t) == next((j for j, (t0, t1, _) in enumerate(deltas) if t0 <= t < t1), None)
        assert watch.after(t) == next((j for j, (t0, t1, _) in enumerate(deltas) if t0 < t <= t1), None)
