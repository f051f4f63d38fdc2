"""A re-simulation started from an observed engine state (a bounded window's start) continues the run exactly:
the state taken from a full run at one of its step ends, re-run from there, gives the same outcomes to every
request arriving after it; and the windows of a never-idle period are bounded in time, not by its length."""

from __future__ import annotations

import math
import random

import pytest

from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.neighbourhoods import bounded_neighbourhoods
from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_start import StepIndex, observed_start, without
from attrib_agent.attribution.sim_step import blocks_for
from attrib_agent.attribution.sim_types import InProgress, SchedulerConfig, SimRequest, SimResult, SimStart
from attrib_agent.timeline.model import StepMember, StepRecord

BS = 16
COST = StepCostModel(StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.001, per_decode_request_s=0.001,
                                   per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
        per_prefill_request_s=0.0))
# A budget no prompt reaches: every prefill completes in its first step, so a request's state at a step end
# is fully told by the tokens it has sampled (none: queued).
SCHED = SchedulerConfig(block_size=BS, num_blocks=513, token_budget=4096, prefix_caching=False)


def workload(seed: int, n: int = 40) -> list[SimRequest]:
    rng = random.Random(seed)
    t = 0.0
    out = []
    for i in range(n):
        t += rng.uniform(0.0, 0.05)
        out.append(SimRequest(f"r{i:02d}", round(t, 4), rng.randint(8, 120), rng.randint(1, 40)))
    return out


def state_at(reqs: list[SimRequest], full: SimResult, t: float) -> SimStart:
    """The state after the step ending at t, read off the full run's outcomes."""
    running, queued = [], []
    for r in reqs:
        o = full.outcomes[r.request_id]
        if r.arrival_ts > t or (o.finish_ts is not None and o.finish_ts <= t):
            continue
        outputs = sum(1 for x in o.token_ts if x <= t)
        if outputs:
            computed = r.prompt_tokens + outputs - 1
            running.append((o.scheduled_ts, r.request_id, InProgress(
                r.request_id, computed, outputs, True, blocks_for(computed, BS), o.scheduled_ts, o.first_token_ts)))
        else:
            queued.append(InProgress(r.request_id, 0, 0, False))
    return SimStart(t, tuple(ip for *_, ip in sorted(running)) + tuple(queued))


@pytest.mark.parametrize("seed", range(6))
def test_a_run_resumed_from_its_own_state_gives_the_same_outcomes(seed: int) -> None:
    reqs = workload(seed)
    ends: list[float] = []
    full = simulate(reqs, SCHED, COST, on_step=lambda plan, running, start, end: ends.append(end))
    assert full.preemptions == 0
    t = max(e for e in ends if e <= reqs[len(reqs) // 2].arrival_ts)  # a step end mid-arrivals
    start = state_at(reqs, full, t)
    assert any(ip.running for ip in start.state)
    kept = [r for r in reqs if r.arrival_ts > t or r.request_id in {ip.request_id for ip in start.state}]
    resumed = simulate(kept, SCHED, COST, start=start)
    later = [r.request_id for r in reqs if r.arrival_ts > t]
    assert later
    for rid in later:
        a, b = full.outcomes[rid], resumed.outcomes[rid]
        assert (a.first_token_ts, a.finish_ts, a.token_ts) == (b.first_token_ts, b.finish_ts, b.token_ts)
    for ip in start.state:  # those in flight carry on where they were
        assert resumed.outcomes[ip.request_id].finish_ts == full.outcomes[ip.request_id].finish_ts


def test_kv_held_at_the_start_delays_a_newcomer_and_removing_its_holder_frees_it() -> None:
    sched = SchedulerConfig(block_size=BS, num_blocks=11, token_budget=4096, prefix_caching=False)
    holder = SimRequest("whale", 0.0, 140, 20)  # 150 tokens in KV at the start: all 10 usable blocks
    newcomer = SimRequest("v", 1.0, 30, 2)
    start = SimStart(1.0, (InProgress("whale", 150, 11, True, 10, 0.0, 0.5),))
    held = simulate([holder, newcomer], sched, COST, start=start)
    freed = simulate([newcomer], sched, COST, start=without(start, frozenset({"whale"})))
    assert held.outcomes["whale"].finish_ts is not None and len(held.outcomes["whale"].token_ts) == 9
    assert (held.outcomes["v"].scheduled_ts or 0.0) >= held.outcomes["whale"].finish_ts
    assert freed.outcomes["v"].scheduled_ts == pytest.approx(1.0)
    with pytest.raises(ValueError, match="start state"):
        simulate([newcomer], sched, COST, start=start)


def test_the_observed_state_comes_from_the_step_members_and_the_queue() -> None:
    reqs = [SimRequest("old", 0.0, 100, 50), SimRequest("gone", 0.5, 10, 2), SimRequest("q", 1.9, 40, 3),
            SimRequest("new", 3.0, 20, 2)]
    ends = {"old": 9.0, "gone": 1.0, "q": 4.0, "new": 5.0}
    step = StepRecord(0, 7, 2.0, 0.01, 0, 0, 1, 1, 0.5, (StepMember("old", "decode", 1, 120, 8),))
    start, kept = observed_start(step, reqs, ends, {})
    assert start.ts == 2.0 and [r.request_id for r in kept] == ["old", "q", "new"]
    assert start.state == (InProgress("old", 120, 21, True, 8, None, None), InProgress("q", 0, 0, False))
    index = StepIndex([step, StepRecord(0, 8, 2.5, 0.01, 0, 0, 1, 1, 0.5, ())])
    assert index.before(2.4) is step and index.before(1.0) is None
    assert index.snapper(1.0)(2.7) == 2.0 and index.snapper(1.0)(1.5) == 1.0


def test_windows_are_bounded_in_time_however_long_the_engine_has_been_busy() -> None:
    """A long generation keeps the busy period open: the old windows reach back to it (and so grow with the
    period); the bounded ones start at most the lookback (and a grid step) before their victim."""
    chain = [(SimRequest("long", 0.0, 300, 5000), 600.0)]
    chain += [(SimRequest(f"s{i:03d}", 1.0 + i, 50, 20), 1.0 + i + 0.8) for i in range(500)]
    victims = {"s100", "s400"}
    # without a lookback: reaching back to t=0, cut at 64 requests: 63 s of steps, for both
    old = [w for _, w, _ in bounded_neighbourhoods(chain, victims, 64, math.inf, lambda t: t)]
    assert [w[0].arrival_ts for w in old] == [38.0, 338.0]
    bounded = bounded_neighbourhoods(chain, victims, 64, 10.0, lambda t: float(int(t)))
    assert [lo for lo, _, _ in bounded] == [91.0, 391.0]
    for (lo, window, mine), v in zip(bounded, ("s100", "s400"), strict=True):
        assert mine == {v} and v in {r.request_id for r in window} and len(window) <= 13  # long, ten before, it
        assert all(r.arrival_ts >= lo or r.request_id == "long" for r in window)
