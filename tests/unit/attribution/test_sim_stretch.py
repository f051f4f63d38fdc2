"""Stretches of alike decode steps taken at once give exactly the step-by-step run (hypothesis).

`simulate` steps one by one when it has an `on_step` observer (the oracle sees every plan), and takes alike
decode stretches in one go otherwise: the two must agree to the last bit on every outcome and total, and a traced
victim's waits per (cause, phase, blamed request) to float rounding (a stretch's are summed in one go,
`StretchTracer`)."""

from __future__ import annotations

from collections import deque
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_cache import FrozenCost
from attrib_agent.attribution.sim_step import LiveRequest, StepPlan
from attrib_agent.attribution.sim_stretch import decode_stretch
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.attribution.sim_types import InProgress, SchedulerConfig, SimRequest, SimResult, SimStart, StepCost

_FLAT = StepCostModel(StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.001, per_decode_request_s=0.001,
                                    per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
                                    per_prefill_request_s=0.0))
COSTS: list[StepCost] = [
    _FLAT,
    StepCostModel(StepCostPrior()),  # context and attention terms too: every step of a stretch costs more
    # frozen fits (the re-simulation's): a stretch's contention is then summed per step, not per member ...
    FrozenCost.of(StepCostModel(StepCostPrior())),
    FrozenCost.of(_FLAT),
    # ... except where a step without one member would cost less than the floor
    replace(FrozenCost.of(StepCostModel(StepCostPrior())), a=0.0, floor_s=0.02),
]


def _same(fast: SimResult, slow: SimResult) -> None:
    """Every outcome and total to the bit; the traced waits summed per (cause, phase, blamed request) to 1e-9."""
    def bare(r: SimResult) -> str:
        return repr(replace(r, outcomes={k: replace(o, waits=()) for k, o in r.outcomes.items()}))

    def sums(r: SimResult, rid: str) -> dict[tuple[str, bool, str], float]:
        o = r.outcomes[rid]
        out: dict[tuple[str, bool, str], float] = {}
        for w in o.waits:
            itl = not (o.first_token_ts is None or w.ts is None or w.ts < o.first_token_ts)
            for other, secs in w.by_request:
                out[(w.cause, itl, other)] = out.get((w.cause, itl, other), 0.0) + secs
        return out

    assert bare(fast) == bare(slow)
    for rid in fast.outcomes:
        a, b = sums(fast, rid), sums(slow, rid)
        scale = max([*a.values(), *b.values(), 1e-3])
        for key in a.keys() | b.keys():
            assert abs(a.get(key, 0.0) - b.get(key, 0.0)) <= 1e-9 * scale, (rid, key)


def _stepwise(_plan: StepPlan, _running: list[LiveRequest], _start: float, _end: float) -> None:
    """An observer: its presence makes `simulate` run every step through `schedule_step`."""


@st.composite
def cases(draw: st.DrawFn) -> tuple[list[SimRequest], SchedulerConfig, int, SimStart | None, list[str]]:
    bs = draw(st.sampled_from([4, 8, 16]))
    config = SchedulerConfig(block_size=bs, num_blocks=draw(st.integers(4, 60)),
                             token_budget=draw(st.sampled_from([4, 8, 32, 128])),
                             max_num_seqs=draw(st.integers(1, 8)), prefix_caching=draw(st.booleans()),
                             warm_prefixes=(("g", draw(st.integers(0, 40))),) if draw(st.booleans()) else ())
    n = draw(st.integers(1, 10))
    requests = []
    for i in range(n):
        grouped = draw(st.booleans())
        requests.append(SimRequest(f"r{i}", draw(st.integers(0, 3000)) / 1000, draw(st.integers(1, 120)),
                                   draw(st.integers(1, 60)), "g" if grouped else None,
                                   draw(st.integers(0, 130)) if grouped else 0))
    start = None
    if draw(st.booleans()):
        on = draw(st.lists(st.sampled_from([r.request_id for r in requests]), unique=True, max_size=n))
        state = tuple(InProgress(rid, draw(st.integers(0, 150)), draw(st.integers(0, 20)), draw(st.booleans()))
                      for rid in on)
        start = SimStart(min(r.arrival_ts for r in requests), state)
    traced = draw(st.lists(st.sampled_from([r.request_id for r in requests]), unique=True, max_size=3))
    return requests, config, draw(st.integers(0, len(COSTS) - 1)), start, traced


@settings(max_examples=300, deadline=None)
@given(cases(), st.booleans(), st.integers(5, 400))
def test_stretches_equal_the_step_by_step_run(case: tuple[list[SimRequest], SchedulerConfig, int, SimStart | None,
                                                          list[str]], await_traced: bool, max_steps: int) -> None:
    requests, config, which, start, traced = case
    kw = {"trace": traced or None, "until_done": traced if await_traced and traced else None,
          "start": start, "max_steps": max_steps}
    fast = simulate(requests, config, COSTS[which], **kw)  # type: ignore[arg-type]
    slow = simulate(requests, config, COSTS[which], on_step=_stepwise, **kw)  # type: ignore[arg-type]
    _same(fast, slow)


class _CountedCost:
    """A cost that logs each price's arity: a stretch prices each of its steps with the four features alone
    (`Pricer.price4`: nothing prefills in it), a step run by `schedule_step` with all five. Counted through the
    cost `simulate` is given, not by patching `scheduler_sim` (a compiled build has no such seam)."""

    def __init__(self, cost: StepCostModel) -> None:
        self.cost, self.arity = cost, []

    def step_seconds(self, t: int, r: int, c: int) -> float:
        self.arity.append(3)
        return self.cost.step_seconds(t, r, c)

    def step_seconds_with_prefill(self, *features: int) -> float:
        self.arity.append(len(features))
        return self.cost.step_seconds_with_prefill(*features)

    def stretches(self) -> list[int]:
        """The steps of each run of four-feature prices in a row."""
        return [len(r) for r in "".join("s" if a == 4 else "." for a in self.arity).split(".") if r]


def test_a_decode_only_batch_runs_as_one_stretch() -> None:
    """Four long decodes with nothing arriving: after the prefill steps, the run is a few stretches, not one
    `schedule_step` per token, and still the step-by-step result."""
    config = SchedulerConfig(block_size=16, num_blocks=200, token_budget=512)
    requests = [SimRequest(f"r{i}", 0.0, 40 + i, 300) for i in range(4)]
    model = COSTS[1]
    assert isinstance(model, StepCostModel)
    counted, stepped = _CountedCost(model), _CountedCost(model)
    fast = simulate(requests, config, counted, trace="r0")
    slow = simulate(requests, config, stepped, on_step=_stepwise, trace="r0")
    _same(fast, slow)
    assert fast.steps == slow.steps >= 300 and sum(counted.stretches()) >= 290 and not stepped.stretches()
    untraced = _CountedCost(model)
    assert simulate(requests, config, untraced).steps == fast.steps
    assert sum(untraced.stretches()) >= 290 and len(untraced.stretches()) <= 3


def test_a_stretch_ends_with_the_step_that_finishes_a_request_or_that_an_arrival_falls_in() -> None:
    config = SchedulerConfig(block_size=4, num_blocks=100, token_budget=64)
    cost = COSTS[0]  # 0.01 s + 1 ms a decode: two decodes take 12 ms a step
    running = []
    for i, target in enumerate((50, 9)):
        lv = LiveRequest(SimRequest(f"r{i}", 0.0, 10, target), i, target, computed=10 + 2, outputs=3,
                         first_token_ts=0.0, blocks=4)
        running.append(lv)
    short = running[1]
    pool = FreeBlockQueue(99)
    pool.allocate(8)
    run = decode_stretch(running, deque(), pool, config, Pricer(cost), 1.0, 1.0, None, 1000)
    assert run is not None and len(run.ends) == 6  # r1 has 9 - 3 = 6 tokens to go: the 6th step finishes it
    assert run.finished == [short] and short.finish_ts == run.ends[-1] and running == [running[0]]
    assert running[0].outputs == 9 and running[0].computed == 18 and running[0].blocks == 5
    assert pool.free == 99 - 5  # r1's five blocks are back
    arrival = 1.1
    run = decode_stretch(running, deque(), pool, config, Pricer(cost), 1.06, 1.06, arrival, 1000)
    assert run is not None and run.ends[-1] >= arrival > run.ends[-2] and not run.finished


@pytest.mark.parametrize("which", range(len(COSTS)))
def test_victims_waiting_behind_a_full_budget_or_the_kv_trace_as_step_by_step(which: int) -> None:
    """Stretches with traced victims queued: behind a full token budget (each step's time split by the running
    decodes' marginals), as the queue's head the pool cannot take (the holders by blocks, which change at block
    boundaries within the stretch), and behind that head (head of line)."""
    budget = SchedulerConfig(block_size=4, num_blocks=400, token_budget=4, max_num_seqs=8)
    decodes = [SimRequest(f"d{i}", 0.0, 3 + 5 * i, 40 + 7 * i) for i in range(4)]
    late = [SimRequest("v", 0.05, 8, 3)]
    for config, requests, traced in (
            (budget, decodes + late, ["v", "d1"]),
            (SchedulerConfig(block_size=4, num_blocks=40, token_budget=64, max_num_seqs=8),
             [*decodes[:3], SimRequest("big", 0.05, 100, 4), SimRequest("v", 0.06, 8, 3)], ["big", "v", "d0"])):
        fast = simulate(requests, config, COSTS[which], trace=traced)
        slow = simulate(requests, config, COSTS[which], on_step=_stepwise, trace=traced)
        _same(fast, slow)
        causes = {w.cause for rid in traced for w in fast.outcomes[rid].waits}
        assert causes & {"kv_pressure", "head_of_line", "decode_batching"}
