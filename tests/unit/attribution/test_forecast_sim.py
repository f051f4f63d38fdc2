"""The forecast's re-simulation: its scheduled step is the attribution's (without objects), its decode
stretches (through finishes, past arrivals queued behind a blocked head, without token times past the window)
give the step-by-step run, and take few calls on a backlog."""

from __future__ import annotations

import math
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.attribution import forecast_sim
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.forecast_sim import Run, simulate_from
from attrib_agent.attribution.forecast_types import EngineState, InFlight
from attrib_agent.attribution.sim_step import LiveRequest, schedule_step
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest

NOW = 100.0
OFF_GRID_S = 1e-6 * math.sqrt(2)  # no sum of the prices' decimals lands on it
COSTS = [
    StepCostModel(),  # the prior: linear in the context, stretches in closed form
    StepCostModel(StepCostPrior(intercept_s=0.004, per_prefill_token_s=2e-5, per_decode_request_s=3e-4,
                                per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0)),
]


@st.composite
def states(draw: st.DrawFn) -> tuple[EngineState, list[tuple[SimRequest, int]], float, int]:
    bs = draw(st.sampled_from([16, 128]))
    sched = SchedulerConfig(block_size=bs, num_blocks=draw(st.integers(8, 120)),
                            token_budget=draw(st.sampled_from([256, 2048])), max_num_seqs=draw(st.integers(2, 8)))
    reqs = []
    for i in range(draw(st.integers(1, 6))):
        prompt = draw(st.integers(8, 3000))
        if draw(st.booleans()):
            outputs = draw(st.integers(1, 50))
            reqs.append(InFlight(f"r{i}", NOW - 1, prompt, prompt + outputs - 1, outputs, draw(st.integers(0, 400)),
                                 True, NOW - 0.5))
        else:
            reqs.append(InFlight(f"w{i}", NOW - 0.5, prompt, 0, 0, draw(st.integers(1, 300)), False))
    gap = draw(st.sampled_from([0.05, 0.2, 0.7]))
    # Arrivals off the decimal grid of the test's step prices: where an arrival falls exactly on a step's end, the
    # closed-form and the step-by-step sums of the same step times may round an ulp apart and admit it one step
    # apart (both valid schedules of an exact tie), which the step-by-step comparison below cannot tell from a bug.
    extra = [(SimRequest(f"x{j}", NOW + gap * (j + 0.5) + OFF_GRID_S, draw(st.integers(8, 3000)),
                         draw(st.integers(1, 300))), 0)
             for j in range(draw(st.integers(0, 12)))]
    return EngineState(NOW, sched, tuple(reqs)), extra, draw(st.sampled_from([0.5, 3.0, 10.0])), draw(
        st.integers(0, len(COSTS) - 1))


def _run(state: EngineState, extra: list[tuple[SimRequest, int]], until: float | None, cost: int,
         itl_limit: float = math.inf) -> Run:
    watch = {r.request_id for r in state.requests} | {r.request_id for r, _ in extra}
    return simulate_from(state, COSTS[cost], extra, watch, 4000, until=until, itl_limit=itl_limit)


@settings(max_examples=100, deadline=None)
@given(states(), st.sampled_from([0.0, 0.004, 0.012, 0.05, 0.25]))
def test_the_window_sums_are_those_of_the_token_times(
        case: tuple[EngineState, list[tuple[SimRequest, int]], float, int], limit: float) -> None:
    """What the harm compares (count, first, last, gaps past the ITL limit of each request's tokens up to
    `until`), summed up as tokens are delivered, equals the same read off the token times, with the stretches
    on (their inner gaps counted once for all members, or skipped below the limit) and off."""
    state, extra, window, cost = case
    until = NOW + window
    for stretches in (True, False):
        with pytest.MonkeyPatch.context() as mp:
            if not stretches:
                mp.setattr(forecast_sim, "_decode_stretch", lambda *a: (0, a[6], [], False))
            run = _run(state, extra, until, cost, limit)
        for rid, times in run.tokens.items():
            ts = [t for t in times if t <= until]
            over = sum(b - a > limit for a, b in zip(ts, ts[1:], strict=False))
            assert run.window[rid] == ([len(ts), ts[0], ts[-1], over] if ts else [0, 0.0, 0.0, 0])


@settings(max_examples=150, deadline=None)
@given(states())
def test_stretches_give_the_step_by_step_run(case: tuple[EngineState, list[tuple[SimRequest, int]], float, int]
                                             ) -> None:
    state, extra, window, cost = case
    until = NOW + window
    fast = _run(state, extra, until, cost)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(forecast_sim, "_decode_stretch", lambda *a: (0, a[6], [], False))
        slow = _run(state, extra, until, cost)
    assert (fast.preemptions, fast.first_stop, fast.first_members) == (slow.preemptions, slow.first_stop,
                                                                        slow.first_members)
    assert fast.first_token.keys() == slow.first_token.keys()
    for rid, t in slow.first_token.items():  # equal but for the rounding of closed-form sums of step times
        assert (t is None) == (fast.first_token[rid] is None)
        assert t is None or fast.first_token[rid] == pytest.approx(t, abs=1e-9)
        window_ts = [x for x in slow.tokens[rid] if x <= until]
        assert fast.tokens[rid][:len(window_ts)] == pytest.approx(window_ts, abs=1e-9)


def test_past_the_window_only_first_tokens_are_followed() -> None:
    """Token times past `until` are not kept by stretches; first tokens and the times within are those of a run
    that keeps every time, to the bit."""
    state = EngineState(NOW, SchedulerConfig(128, 40, 2048), (
        InFlight("a", NOW - 1, 2000, 2050, 51, 700, True, NOW - 0.5),
        InFlight("b", NOW - 1, 1500, 1510, 11, 600, True, NOW - 0.2),
        InFlight("c", NOW - 0.5, 3000, 0, 0, 300, False)))
    extra = [(SimRequest(f"x{j}", NOW + 0.3 * j, 1800, 200), 0) for j in range(12)]
    windowed = _run(state, extra, NOW + 2.0, 0)
    with pytest.MonkeyPatch.context() as mp:  # the window reaches past the end: every time kept
        mp.setattr(forecast_sim, "_decode_stretch", _keeping_all(forecast_sim._decode_stretch, NOW + 2.0))
        kept = _run(state, extra, NOW + 2.0, 0)
    assert windowed.first_token == kept.first_token
    assert max(t for t in windowed.first_token.values() if t is not None) > NOW + 5  # followed past the window
    for rid, ts in kept.tokens.items():
        assert [t for t in windowed.tokens[rid] if t <= NOW + 2.0] == [t for t in ts if t <= NOW + 2.0]
    assert sum(map(len, windowed.tokens.values())) < 0.5 * sum(map(len, kept.tokens.values()))


def _keeping_all(real: Any, until: float) -> Any:
    def stretch(*a: Any) -> Any:
        return real(*a[:9], None, *a[10:])  # no window: every stretch keeps its times
    return stretch


def test_a_backlog_runs_through_its_arrivals_in_few_stretches(monkeypatch: pytest.MonkeyPatch) -> None:
    """Whales arriving 5 a second behind a queue head that cannot fit join the queue and change nothing: the
    decoders' stretch goes on past them (one call, not one per arrival), and ends with the finishing step."""
    state = EngineState(NOW, SchedulerConfig(128, 90, 2048), (  # 65 of 89 blocks held, 24 free: c needs 28
        InFlight("a", NOW - 1, 4000, 4100, 101, 400, True, NOW - 0.5),
        InFlight("b", NOW - 1, 4000, 4090, 91, 420, True, NOW - 0.4),
        InFlight("c", NOW - 0.5, 3500, 0, 0, 800, False)))
    extra = [(SimRequest(f"x{j}", NOW + 0.1 + 0.2 * j, 3500, 800), 0) for j in range(20)]
    calls: list[tuple[int, int]] = []
    real = forecast_sim._decode_stretch

    def counted(*a: Any) -> Any:
        got = real(*a)
        calls.append((got[0], len(got[2])))
        return got

    monkeypatch.setattr(forecast_sim, "_decode_stretch", counted)
    run = _run(state, extra, NOW + 10, 0)
    jumps = [c for c in calls if c[0]]
    assert jumps[0] == (399, 1)  # after the first step (always scheduled), to a's finish, past a dozen arrivals
    assert run.first_token["c"] is not None and run.first_token["c"] > NOW + 1


def _plan_by_schedule_step(running: list[LiveRequest], waiting: Any, pool: Any, config: SchedulerConfig, now: float,
                           out: list[tuple[LiveRequest, int]]) -> tuple[Any, ...]:
    """`plan_sync` as the attribution's `schedule_step` (with `Member` objects) and `Pricer.features` give it."""
    plan = schedule_step(running, waiting, pool, config, now)
    by_id = {lv.req.request_id: lv for lv in running}  # every member runs after its step is planned
    out.extend((by_id[m.request_id], m.tokens) for m in plan.members)
    return (len(plan.preempted), plan.stop, plan.blocked, *Pricer.features(plan.members))


@settings(max_examples=120, deadline=None)
@given(states(), st.booleans())
def test_the_forecast_step_is_the_attributions_step(
        case: tuple[EngineState, list[tuple[SimRequest, int]], float, int], stretches: bool) -> None:
    """The forecast's scheduled step without objects (`sim_step.plan_sync`, delivered in one pass) gives the run
    `schedule_step` gives, to the bit: first tokens, every token time, window sums, preemptions, first step."""
    state, extra, window, cost = case
    with pytest.MonkeyPatch.context() as mp:
        if not stretches:
            mp.setattr(forecast_sim, "_decode_stretch", lambda *a: (0, a[6], [], False))
        fast = _run(state, extra, NOW + window, cost, 0.012)
        mp.setattr(forecast_sim, "plan_sync", _plan_by_schedule_step)
        slow = _run(state, extra, NOW + window, cost, 0.012)
    assert fast == slow


@settings(max_examples=300, deadline=None)
@given(st.floats(1e-4, 0.5), st.floats(-1e-6, 1e-3), st.integers(1, 5000), st.floats(0.0, 1.0),
       st.floats(1.0, 2e9))
def test_a_stretch_stops_at_the_step_an_arrival_falls_in(first: float, slope: float, m: int, where: float,
                                                         now: float) -> None:
    """`_alike` ends a stretch with the first step whose end reaches the next arrival: the same step a scan of
    the step ends finds (its search starts from the closed form's root)."""
    slope = max(slope, -first / (2 * m))  # every step costs more than nothing
    arrival = now + where * (m * first + slope * (m - 1) * m / 2) * 1.01
    ends: list[forecast_sim.Piece] = []
    steps, last, _ = forecast_sim._alike(lambda t, n, c, p: first + slope * (c - 7) / 3, 3, 7, now, m, arrival,
                                          ends)
    [piece] = ends
    assert isinstance(piece, tuple)
    _, a, b, kept = piece  # the prices `_alike` read off the cost model: the step ends are those of the scan below
    end = [now + (j + 1) * a + b * j * (j + 1) / 2 for j in range(m)]
    expect = next((j + 1 for j, e in enumerate(end) if e >= arrival), m)
    assert steps == kept == expect
    assert last == end[steps - 1]


def test_an_idle_engines_step_for_a_request_waiting_since_before_now_is_under_way() -> None:
    """vLLM starts a step as soon as a request reaches an idle engine: at `now` that step has run since the
    request came (no step line has ended it yet), so the run starts it then, and a newcomer joins the step after
    it (the first to start from now, whose members say who is admitted now). A request that has waited longer
    than its first chunk takes is not in such a step (the state is behind the engine): the run starts at now."""
    sched = SchedulerConfig(block_size=16, num_blocks=1000, token_budget=2048, max_num_seqs=8)
    cost = COSTS[1]  # 4 ms a step and 20 us a prefill token: a 2,048-token chunk takes ~45 ms
    price = Pricer(cost).price5
    chunk = price(2048, 0, 0, 2048 * 2049 // 2, 1)
    newcomer = [(SimRequest("c", NOW, 512, 5), 0)]
    for waited, began in ((0.02, NOW - 0.02), (chunk - 1e-6, NOW - chunk + 1e-6), (0.5, NOW)):
        state = EngineState(NOW, sched, (InFlight("w1", NOW - waited, 2048, 0, 0, 10, False),))
        run = simulate_from(state, cost, newcomer, {"w1", "c"}, 100)
        assert run.first_token["w1"] == pytest.approx(began + chunk)
        # the first step to start from now: w1's first decode beside c's prefill; from now, w1's chunk (full budget)
        assert run.first_members == ({"w1", "c"} if began < NOW else {"w1"})
        assert run.first_token["c"] == pytest.approx(began + chunk + price(512, 1, 2049, 512 * 513 // 2, 1))
    running = EngineState(NOW, sched, (InFlight("r", NOW - 1, 100, 100, 1, 10, True, NOW - 0.5),
                                       InFlight("w1", NOW - 0.02, 1024, 0, 0, 10, False)))
    run = simulate_from(running, cost, [], {"w1"}, 100)  # a busy engine: its steps go on from now
    assert run.first_token["w1"] == pytest.approx(NOW + price(1024, 1, 101, 1024 * 1025 // 2, 1))
