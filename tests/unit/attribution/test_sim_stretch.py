"""Stretches of alike decode steps taken at once give exactly the step-by-step run (hypothesis).

`simulate` steps one by one when it has an `on_step` observer (the oracle sees every plan), and takes alike
decode stretches in one go otherwise: the two must agree to the last bit on every outcome, trace and total."""

from __future__ import annotations

from collections import deque
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import attrib_agent.attribution.scheduler_sim as scheduler_sim
from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_step import LiveRequest, StepPlan
from attrib_agent.attribution.sim_stretch import Stretch, decode_stretch
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.attribution.sim_types import InProgress, SchedulerConfig, SimRequest, SimStart

COSTS = [
    StepCostModel(StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.001, per_decode_request_s=0.001,
                                per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
        per_prefill_request_s=0.0)),
    StepCostModel(StepCostPrior()),  # context and attention terms too: every step of a stretch costs more
]


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
    assert repr(fast) == repr(slow)


def test_a_decode_only_batch_runs_as_one_stretch(monkeypatch: pytest.MonkeyPatch) -> None:
    """Four long decodes with nothing arriving: after the prefill steps, the run is a few stretches, not one
    `schedule_step` per token, and still the step-by-step result."""
    config = SchedulerConfig(block_size=16, num_blocks=200, token_budget=512)
    requests = [SimRequest(f"r{i}", 0.0, 40 + i, 300) for i in range(4)]
    calls: list[int] = []

    def counted(*args: Any) -> Stretch | None:
        got = decode_stretch(*args)
        if got is not None:
            calls.append(len(got.ends))
        return got

    monkeypatch.setattr(scheduler_sim, "decode_stretch", counted)
    fast = simulate(requests, config, COSTS[1])
    slow = simulate(requests, config, COSTS[1], on_step=_stepwise)
    assert repr(fast) == repr(slow)
    assert fast.steps == slow.steps >= 300 and sum(calls) >= 290 and len(calls) <= 3


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
