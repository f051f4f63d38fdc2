"""`ExactSteps.overlay` keeps each step's overlay from one call to the next while nothing it reads changes. Each
test changes one thing a kept overlay read, checks the overlay changed with it, and that it is the overlay built
from nothing; a kept overlay that missed the change fails."""

from __future__ import annotations

import copy
from dataclasses import replace

from attrib_agent.events import ScheduledRequest, SchedulerHello, SchedulerStep
from attrib_agent.timeline.exact import ExactSteps, Outcomes
from attrib_agent.timeline.model import StepRecord
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome


def _pair(iteration: int) -> tuple[StepInput, StepOutcome]:
    si = StepInput(iteration, 0, iteration, 10.0 + iteration, 0.02, 1, 5, 0, 0, 0.1)
    return si, StepOutcome(StepRecord(0, iteration, si.end_ts, si.elapsed_s, 1, 5, 0, 0, 0.1))


def _step(iteration: int | None, scheduled: tuple[ScheduledRequest, ...] = (), blocks: tuple[tuple[str, int], ...] = (),
          preempted: tuple[str, ...] = (), finished: tuple[str, ...] = ()) -> SchedulerStep:
    return SchedulerStep(ts=0.0, sched_ts=0.0, engine=0, step=0, iteration=iteration, tokens=0, scheduled=scheduled,
                         admitted=(), resumed=(), preempted=preempted, finished=finished, running=0, waiting=0,
                         blocks=blocks, free_blocks=None, total_blocks=None, head=None, drops=0)


def _sched(rid: str, new: int, done: int, cached: int | None = None) -> ScheduledRequest:
    return ScheduledRequest(rid, new, done, cached)


def _overlay(exact: ExactSteps, outcomes: Outcomes, prompts: dict[str, int],
             block_size: int | None = None) -> Outcomes:
    """The kept overlay, checked against one built from nothing on the same facts."""
    fresh = copy.copy(exact)
    fresh._overlaid = {}  # noqa: SLF001 (nothing kept)
    kept = exact.overlay(outcomes, prompts.get, block_size)
    assert repr(kept) == repr(fresh.overlay(outcomes, prompts.get, block_size))
    assert len(exact._overlaid) <= len(outcomes)  # noqa: SLF001 (the bound: only the steps of the last call)
    return kept


def _phases(outcomes: Outcomes, i: int = 0) -> list[str]:
    return [m.phase for m in outcomes[i][1].record.members]


def test_a_prompt_learnt_later_changes_a_members_phase() -> None:
    exact = ExactSteps()
    exact.add(_step(1, (_sched("a", 5, 10),), (("a", 1),)))
    outcomes, prompts = [_pair(1)], {}
    assert _phases(_overlay(exact, outcomes, prompts)) == ["prefill"]
    prompts["a"] = 8  # its span came: 10 tokens done of an 8-token prompt is a decode
    assert _phases(_overlay(exact, outcomes, prompts)) == ["decode"]


def test_a_preemption_reported_later_makes_the_earlier_prefill_a_recompute() -> None:
    exact = ExactSteps()
    exact.add(_step(1, (_sched("a", 5, 0),), (("a", 1),)))
    outcomes = [_pair(1)]
    assert _phases(_overlay(exact, outcomes, {})) == ["prefill"]
    exact.add(_step(2, preempted=("a",)))
    outcomes.append(_pair(2))
    assert _phases(_overlay(exact, outcomes, {})) == ["recompute"]


def test_a_prefix_hit_reported_later_and_the_block_size_share_the_holders_blocks() -> None:
    exact = ExactSteps()
    exact.add(_step(1, (_sched("a", 5, 0),), (("a", 2),)))
    outcomes = [_pair(1)]
    assert _overlay(exact, outcomes, {}, 16)[0][1].prefix_shares == ()
    exact.add(_step(2, (_sched("a", 5, 5, cached=32),), (("a", 2),)))
    outcomes.append(_pair(2))
    assert _overlay(exact, outcomes, {}, 16)[0][1].prefix_shares == (("a", "a", 2),)
    assert _overlay(exact, outcomes, {}, None)[0][1].prefix_shares == ()  # no block size: no hit in blocks
    exact.add(SchedulerHello(ts=0.0, engine=0, block_size=32, total_blocks=100, max_num_seqs=None, token_budget=None))
    assert _overlay(exact, outcomes, {}, 16)[0][1].prefix_shares == (("a", "a", 1),)  # the plugin's block size


def test_a_request_reported_finished_after_the_step_lets_its_blocks_go() -> None:
    exact = ExactSteps()
    exact.add(_step(1, (_sched("a", 1, 9), _sched("b", 1, 9)), (("a", 2), ("b", 1))))
    outcomes = [_pair(1)]
    assert _overlay(exact, outcomes, {})[0][1].holdings == (("a", 2), ("b", 1))
    exact.add(_step(None, finished=("b",)))  # the schedule() after the last step: b finished at its end
    assert _overlay(exact, outcomes, {})[0][1].holdings == (("a", 2),)


def test_the_step_before_going_out_of_the_bound_takes_its_blocks_from_a_preemption() -> None:
    exact = ExactSteps(max_steps=2)
    exact.add(_step(1, (_sched("a", 1, 9),), (("a", 3),)))
    exact.add(_step(2, preempted=("a",)))
    outcomes = [_pair(2)]
    assert _overlay(exact, outcomes, {})[0][1].preemptions[0].blocks_freed == 3
    exact.add(_step(3))
    assert _overlay(exact, outcomes, {})[0][1].preemptions[0].blocks_freed == 0  # step 1 is no longer held


def test_a_reinferred_outcome_keeps_the_plugins_facts_over_its_own() -> None:
    exact = ExactSteps()
    exact.add(_step(1, (_sched("a", 5, 0),), (("a", 1),)))
    si, o = _pair(1)
    first = _overlay(exact, [(si, o)], {})[0][1]
    again = _overlay(exact, [(si, replace(o, observed_blocks=7.0))], {})[0][1]
    assert first.observed_blocks is None and again.observed_blocks == 7.0
    assert again.record.members == first.record.members and again.holdings == first.holdings
