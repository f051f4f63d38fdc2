"""The admission forecast on hand-built engine states: admission, KV waits, refusal, harm to requests in flight
and to expected arrivals, SLO counts, batches, cached prefixes, and the decode fast path changing nothing."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from attrib_agent.attribution import forecast_sim
from attrib_agent.attribution.cost_model import PriceRange, StepCostModel
from attrib_agent.attribution.forecast import (
    ArrivalLoad,
    Candidate,
    EngineState,
    ForecastConfig,
    InFlight,
    PriceCheck,
    arrival_chance,
    baseline,
    forecast,
    phase_extra_s,
    price_check,
)
from attrib_agent.attribution.sim_types import SchedulerConfig

COST = StepCostModel()  # the prior: the lab's CPU figures


class Seen:
    """The prior's prices as if a fit had been fitted on prefill up to `seen` (a `price_range`): the verdict tests
    below are about harm, not about the evidence behind a price (`test_a_price_beyond_what_the_fit_saw...`)."""

    def __init__(self, cost: StepCostModel, seen: PriceRange) -> None:
        self.step_seconds = cost.step_seconds
        self.step_seconds_with_prefill = cost.step_seconds_with_prefill
        self.price_range = seen


FITTED = Seen(COST, PriceRange(2048, 10**9))  # every candidate below priced from evidence
SCHED = SchedulerConfig(block_size=128, num_blocks=96, token_budget=2048)
NOW = 1000.0


def decoding(rid: str, prompt: int, outputs: int, remaining: int) -> InFlight:
    return InFlight(rid, NOW - 1, prompt, prompt + outputs - 1, outputs, remaining, True, NOW - 0.5)


def waiting(rid: str, prompt: int, max_tokens: int) -> InFlight:
    return InFlight(rid, NOW - 0.01, prompt, 0, 0, max_tokens, False, None)


def test_an_idle_engine_admits_now_at_the_solo_ttft_and_harms_nobody() -> None:
    state = EngineState(NOW, SCHED, (), ArrivalLoad(0.0, 32, 32), ttft_offset_s=0.01)  # declared: nobody comes
    [f] = forecast(state, [Candidate(5000, 100)], FITTED)
    assert f.admitted_now and f.wait_reason is None and not f.refused
    assert f.own_ttft_s is not None
    assert math.isclose(f.own_ttft_s, COST.solo_ttft_s(5000, 2048) + 0.01, rel_tol=1e-9)
    assert f.ttft_extra_sum_s == 0 and f.in_flight.requests == 0 and f.expected.requests == 0
    assert f.harmless(ForecastConfig()) and f.load_basis == "declared"


def test_with_no_load_known_a_probe_arrival_says_what_the_next_request_waits_never_a_confident_zero() -> None:
    """A fresh agent (no arrival seen, none saved, none declared) used to expect nobody and call every whale
    harmless; the truths' whales that came first slowed shorts 2x. Now one probe arrives behind the candidate."""
    idle = EngineState(NOW, SCHED, ())
    [whale] = forecast(idle, [Candidate(5000, 100)], FITTED)
    assert whale.load_basis == "probe" and whale.expected.requests == 1 and whale.expected_load is None
    # the probe waits for the whale's first two 2,048-token chunks: head-of-line, priced by the prior
    assert whale.expected.ttft_extra_sum_s > COST.solo_ttft_s(4096, 2048) * 0.9
    assert not whale.harmless(ForecastConfig()) and whale.as_dict()["load_basis"] == "probe"
    # a decode-heavy candidate delays the probe by little, but stays on the engine for seconds: not harmless
    [decoy] = forecast(idle, [Candidate(32, 1500)], FITTED)
    assert decoy.ttft_extra_sum_s < ForecastConfig().harmless_s and not decoy.harmless(ForecastConfig())
    # ... while one that is gone within the threshold is
    [tiny] = forecast(idle, [Candidate(16, 2)], FITTED)
    assert tiny.load_basis == "probe" and tiny.harmless(ForecastConfig())


def test_a_full_pool_makes_it_wait_for_kv_and_a_too_big_one_is_refused() -> None:
    # 95 usable blocks; the running request holds 80 of them (10,240 tokens) and needs more as it decodes
    state = EngineState(NOW, SCHED, (decoding("big", 10_000, 200, 40),))
    [f] = forecast(state, [Candidate(3000, 100)], COST)
    assert not f.admitted_now and f.wait_reason == "kv"
    assert f.own_ttft_s is not None and f.own_ttft_s > COST.solo_ttft_s(3000, 2048) + 0.2  # waited for big
    [huge] = forecast(state, [Candidate(12_000, 500)], COST)
    assert huge.refused and huge.own_ttft_s is None and huge.ttft_extra_sum_s == 0


def test_a_whale_slows_the_decoders_in_flight_and_delays_the_queued_short_behind_its_prefill() -> None:
    shorts = tuple(decoding(f"s{i}", 32, 5, 27) for i in range(3))
    state = EngineState(NOW, SCHED, shorts)
    [f] = forecast(state, [Candidate(6000, 600)], COST)
    assert f.in_flight.requests == 3
    assert f.in_flight.itl_extra_max_s > 0.01  # three of their gaps are 2,048-token prefill chunks
    assert f.in_flight.itl_slo_pushed == 3  # ... which the p95 of 27 gaps sees
    assert math.isclose(f.in_flight.itl_extra_sum_s, 3 * f.in_flight.itl_extra_max_s, rel_tol=0.05)
    assert f.in_flight.ttft_extra_sum_s == 0  # they had their first token already
    # a short arriving after the whale waits for its prefill chunks
    load = ArrivalLoad(2.0, 32, 32, first_in_s=0.1)
    [g] = forecast(EngineState(NOW, SCHED, shorts, load), [Candidate(6000, 600)], COST, ForecastConfig(horizon_s=3))
    assert g.expected.requests == 6
    by_id = dict(g.expected.ttft_extra_by_request)
    assert by_id["expected-0"] > 0.3 and by_id["expected-0"] == g.expected.ttft_extra_max_s
    assert g.ttft_extra_sum_s == g.in_flight.ttft_extra_sum_s + g.expected.ttft_extra_sum_s
    assert not g.harmless(ForecastConfig())


def test_expected_arrivals_are_bounded() -> None:
    state = EngineState(NOW, SCHED, (), ArrivalLoad(1000.0, 32, 32))
    [f] = forecast(state, [Candidate(100, 10)], COST, ForecastConfig(max_expected=3))
    assert f.expected.requests == 3
    [g] = forecast(state, [Candidate(100, 10)], COST)
    assert g.expected.requests == ForecastConfig().max_expected == 64


def test_slo_counts_only_requests_pushed_past_the_slo() -> None:
    state = EngineState(NOW, SCHED, (waiting("q", 32, 32),), ArrivalLoad(2.0, 32, 32, first_in_s=0.05))
    strict = ForecastConfig(ttft_slo_s=0.2, itl_p95_slo_s=0.05, horizon_s=1)
    [f] = forecast(state, [Candidate(6000, 50)], COST, strict)
    assert f.expected.ttft_slo_pushed >= 1
    [lax] = forecast(state, [Candidate(6000, 50)], COST, ForecastConfig(horizon_s=1))
    assert lax.expected.ttft_slo_pushed == 0 and lax.ttft_extra_sum_s == f.ttft_extra_sum_s


def test_a_batch_gives_each_candidate_its_own_forecast() -> None:
    state = EngineState(NOW, SCHED, (decoding("a", 500, 3, 100),), ArrivalLoad(1.0, 32, 32))
    cands = [Candidate(32, 32), Candidate(7000, 300), Candidate(2000, 10, cached_prefix_tokens=1920)]
    batch = forecast(state, cands, COST)
    assert [f.candidate for f in batch] == cands
    assert batch == [forecast(state, [c], COST)[0] for c in cands]
    small, whale, cached = batch
    assert whale.ttft_extra_sum_s > small.ttft_extra_sum_s
    [uncached] = forecast(state, [Candidate(2000, 10)], COST)
    assert cached.own_ttft_s is not None and uncached.own_ttft_s is not None
    assert cached.own_ttft_s < 0.5 * uncached.own_ttft_s  # 15 of its 16 prompt blocks were cached


def test_the_decode_fast_path_gives_exactly_the_step_by_step_result(monkeypatch: pytest.MonkeyPatch) -> None:
    state = EngineState(NOW, SCHED, (decoding("a", 3000, 10, 400), decoding("b", 40, 2, 30), waiting("c", 900, 64)),
                        ArrivalLoad(1.5, 64, 48))
    cands = [Candidate(6000, 200), Candidate(300, 20)]
    fast = forecast(state, cands, COST)
    assert fast[0].expected.requests == 15 and fast[0].ttft_extra_sum_s > 0.3
    monkeypatch.setattr(forecast_sim, "_decode_stretch", lambda *a: (0, a[6], [], False))
    slow = forecast(state, cands, COST)
    for f, s in zip(fast, slow, strict=True):  # equal but for float rounding (closed-form sums of step times)
        assert f.admitted_now == s.admitted_now and f.preemptions == s.preemptions
        assert f.own_ttft_s == pytest.approx(s.own_ttft_s, abs=1e-9)
        for a, b in ((f.in_flight, s.in_flight), (f.expected, s.expected)):
            assert a.as_dict() == pytest.approx(b.as_dict(), abs=1e-9)


def test_stretch_ends_in_plain_python_or_numpy_are_the_same_floats(monkeypatch: pytest.MonkeyPatch) -> None:
    state = EngineState(NOW, SCHED, (decoding("a", 3000, 10, 400), decoding("b", 40, 2, 30), waiting("c", 900, 64)),
                        ArrivalLoad(1.5, 64, 48))
    cands = [Candidate(6000, 200), Candidate(300, 20)]
    runs = []
    for small in (0, 10**9):  # every stretch through numpy, then every one in Python
        monkeypatch.setattr(forecast_sim, "SMALL_STRETCH", small)
        runs.append((baseline(state, COST).run, [f.as_dict() for f in forecast(state, cands, COST)]))
    (base_np, fc_np), (base_py, fc_py) = runs
    assert base_np.tokens == base_py.tokens and base_np.first_token == base_py.first_token  # exactly, not approx
    assert fc_np == fc_py


def test_bad_candidates_and_configs_are_refused() -> None:
    with pytest.raises(ValueError, match="prompt_tokens"):
        Candidate(0, 5)
    with pytest.raises(ValueError, match="cached_prefix_tokens"):
        Candidate(10, 5, cached_prefix_tokens=11)
    with pytest.raises(ValueError):
        ForecastConfig(horizon_s=0)
    with pytest.raises(ValueError):
        ArrivalLoad(-1.0, 5, 5)


def test_runs_stop_at_the_window_and_every_ttft_is_what_the_full_run_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """The runs stop at the horizon once every watched request has its first token (TTFTs are followed past it);
    ITL is compared over the window. The TTFT answers are those of runs to the last finish."""
    state = EngineState(NOW, SCHED, (decoding("a", 3000, 10, 900), decoding("b", 40, 2, 700), waiting("c", 900, 64)),
                        ArrivalLoad(2.0, 64, 400))
    cands = [Candidate(6000, 600), Candidate(300, 20)]
    cfg = ForecastConfig(horizon_s=3.0)
    stopped: list[float] = []
    real = forecast_sim.simulate_from

    def spy(*a: object, **k: object) -> forecast_sim.Run:
        run = real(*a, **{**k, "keep_tokens": True})  # type: ignore[arg-type]  # its token times: how far it ran
        stopped.append(max((t for ts in run.tokens.values() for t in ts), default=NOW))
        return run

    monkeypatch.setattr("attrib_agent.attribution.forecast.simulate_from", spy)
    windowed = forecast(state, cands, COST, cfg)
    windowed_ends, stopped[:] = list(stopped), []
    monkeypatch.setattr("attrib_agent.attribution.forecast.simulate_from",
                        lambda *a, **k: spy(*a, **{**k, "until": None}))
    monkeypatch.setattr("attrib_agent.attribution.forecast.window_end", lambda s, c: math.inf)
    full = forecast(state, cands, COST, cfg)
    assert len(windowed_ends) == len(stopped) == 3  # the base run and one per candidate
    assert max(windowed_ends) < NOW + 6 < NOW + 9 < min(stopped)  # the decoders' 700-900 tokens not run out
    for w, f in zip(windowed, full, strict=True):
        assert w.own_ttft_s == f.own_ttft_s and w.admitted_now == f.admitted_now
        for a, b in ((w.in_flight, f.in_flight), (w.expected, f.expected)):
            assert (a.ttft_extra_sum_s, a.ttft_extra_max_s, a.ttft_slo_pushed, a.ttft_extra_by_request) == (
                b.ttft_extra_sum_s, b.ttft_extra_max_s, b.ttft_slo_pushed, b.ttft_extra_by_request)
    assert windowed[0].in_flight.itl_extra_max_s > 0  # the whale's prefill chunks fall in the window


def test_a_mixed_stream_is_forecast_size_by_size_and_a_shared_prefix_is_computed_once() -> None:
    # A third of the stream is 1,024-token prompts: its median (32) would hide them. In turn, they are there.
    mix = ((32, 32), (32, 32), (1024, 32))
    load = ArrivalLoad(3.0, 32, 32, first_in_s=0.05, mix=mix)
    sizes = [load.size(i) for i in range(6)]
    assert sizes == [*mix, *mix]
    cfg = ForecastConfig(horizon_s=3)
    [mixed] = forecast(EngineState(NOW, SCHED, (), load), [Candidate(6000, 16)], COST, cfg)
    [median] = forecast(EngineState(NOW, SCHED, (), ArrivalLoad(3.0, 32, 32, first_in_s=0.05)),
                        [Candidate(6000, 16)], COST, cfg)
    assert mixed.expected.requests == median.expected.requests == 9
    assert mixed.expected.ttft_extra_sum_s > median.expected.ttft_extra_sum_s  # long ones queue behind longer
    # RAG: 1,856-token prompts sharing 1,792 tokens (a system prompt and a document). Computed once, not 9 times.
    rag = ArrivalLoad(3.0, 1856, 32, first_in_s=0.05)
    [alone] = forecast(EngineState(NOW, SCHED, (), rag), [Candidate(6000, 16)], COST, cfg)
    [shared] = forecast(EngineState(NOW, SCHED, (), replace(rag, cached_prefix_tokens=1792)),
                        [Candidate(6000, 16)], COST, cfg)
    assert shared.expected.ttft_extra_sum_s < 0.8 * alone.expected.ttft_extra_sum_s
    with pytest.raises(ValueError):
        ArrivalLoad(1.0, 32, 32, mix=((0, 5),))


def test_a_short_made_twice_as_slow_is_harm_though_the_summed_extra_is_under_the_threshold() -> None:
    """The issue's rule is about any short slowed 2x, not the sum: a 600-token prompt sent with a short makes
    the short's 8.5 ms TTFT ~50 ms (41 ms summed, under `harmless_s`): called harmless before, not now."""
    cfg = ForecastConfig(horizon_s=0.5)
    state = EngineState(NOW, SCHED, (), ArrivalLoad(1.0, 32, 8, first_in_s=0.0))  # one short, arriving with it
    [f] = forecast(state, [Candidate(600, 4)], FITTED, cfg)
    assert f.ttft_extra_sum_s < cfg.harmless_s and f.expected.slowed == 1 and not f.harmless(cfg)
    assert f.as_dict()["expected_arrivals"]["slowed"] == 1  # type: ignore[index]
    # a tiny one delays the short by less than its own TTFT: harmless, nobody slowed
    [tiny] = forecast(state, [Candidate(16, 2)], FITTED, cfg)
    assert tiny.expected.slowed == 0 and tiny.harmless(cfg)
    # the ratio is a setting: at 10x the 600-token prompt slows nobody that much
    assert forecast(state, [Candidate(600, 4)], FITTED, replace(cfg, slowed_ratio=10.0))[0].harmless(cfg)
    with pytest.raises(ValueError):
        ForecastConfig(slowed_ratio=1.0)


def test_a_time_without_the_candidate_counts_as_at_least_one_step_so_1_ms_made_2_ms_is_not_a_slowdown() -> None:
    from attrib_agent.attribution.forecast import _harm
    from attrib_agent.attribution.forecast_sim import Run

    def run(first: float) -> Run:
        return Run({"r": NOW + first}, {}, 0, "", frozenset(), None, {})

    cfg = ForecastConfig()
    assert _harm(run(0.001), run(0.002), {"r": NOW}, ("r",), 0.0, cfg, step_s=0.0).slowed == 1
    assert _harm(run(0.001), run(0.002), {"r": NOW}, ("r",), 0.0, cfg, step_s=0.0015).slowed == 0
    assert _harm(run(0.001), run(0.003), {"r": NOW}, ("r",), 0.0, cfg, step_s=0.0015).slowed == 1
    # a mean token gap doubled counts too (window: count, first, last, gaps over the ITL limit)
    was, now = Run({}, {}, 0, "", frozenset(), None, {"r": [11, 0.0, 0.1, 0]}), \
        Run({}, {}, 0, "", frozenset(), None, {"r": [11, 0.0, 0.2, 0]})
    assert _harm(was, now, {}, ("r",), 0.0, cfg, step_s=0.005).slowed == 1
    assert _harm(was, now, {}, ("r",), 0.0, cfg, step_s=0.011).slowed == 0


def test_a_price_beyond_what_the_fit_saw_is_flagged_and_never_harmless() -> None:
    """Issue 16: a fit of 1,024-token prompts priced a 3,900-token whale's chunks at half their time, and the
    forecast called it harmless. A candidate whose largest chunk (tokens, or attention pairs over its context)
    is beyond every step the fit was fitted on is flagged `extrapolated`, and its verdict is never harmless."""
    idle = EngineState(NOW, SCHED, (), ArrivalLoad(0.0, 32, 32))  # declared: nobody comes, nobody in flight
    seen = Seen(COST, PriceRange(1024, 1024 * 1025 // 2))  # one 1,024-token prompt's chunk, the most it saw
    small, same, longer, whale = forecast(idle, [Candidate(600, 4), Candidate(1024, 4), Candidate(1500, 4),
                                                 Candidate(3900, 4)], seen)
    for f in (small, same, longer, whale):  # nobody to harm: only the evidence decides
        assert f.ttft_extra_sum_s == 0 and f.in_flight.requests == f.expected.requests == 0
    assert small.harmless(ForecastConfig()) and same.harmless(ForecastConfig())
    assert small.as_dict()["price_evidence"] == "fitted"
    assert not longer.harmless(ForecastConfig()) and not whale.harmless(ForecastConfig())
    d = whale.as_dict()
    assert d["price_evidence"] == "extrapolated"
    assert d["price_seen"] == {"prefill_tokens": 1024, "prefill_pairs": 1024 * 1025 // 2, "decodes_beside": 0}
    # its largest chunk is the budget's 2,048 tokens; the most attention, the second one over 2,048 before it
    assert d["price_needed"] == {"prefill_tokens": 2048, "prefill_pairs": 1852 * 2048 + 1852 * 1853 // 2}
    # the context counts too: as many tokens per chunk as seen, but attending over more
    wide = Seen(COST, PriceRange(2048, 2048 * 2049 // 2))
    [two] = forecast(idle, [Candidate(2048, 4)], wide)
    [four] = forecast(idle, [Candidate(4096, 4)], wide)
    assert two.harmless(ForecastConfig()) and not four.harmless(ForecastConfig())
    assert four.price is not None and four.price.needed.prefill_tokens == 2048 and four.price.extrapolated
    # a cached prefix is not computed but attended to: the chunk is smaller, the pairs are not
    check = price_check(Candidate(3000, 4, cached_prefix_tokens=2000), 2048, wide)
    assert check == PriceCheck(PriceRange(2048, 2048 * 2049 // 2), PriceRange(1000, 1000 * 2000 + 1000 * 1001 // 2))
    # the prior alone rests on no step at all; a cost that keeps no range (a fixed price) is not judged
    [prior] = forecast(idle, [Candidate(16, 2)], COST)
    assert prior.extrapolated and not prior.harmless(ForecastConfig())
    assert price_check(Candidate(16, 2), 2048, object()) is None


def test_with_the_streams_phase_unknown_harmless_needs_the_next_arrival_unlikely_to_land_behind_the_candidate() -> None:
    """Issue 16, learnt load: the runs place the next arrival half a gap ahead, after a prefill shorter than that,
    so nobody is harmed in the forecast, while a Poisson stream of that rate lands in the prefill 1 - exp(-rate x
    prefill) of the time and that short waits for it (mixed/w1 in the lab: 25 %, a short slowed 5x). With the
    phase unknown such a candidate is not harmless; a declared `first_in_s` keeps its phase, and the runs decide."""
    assert arrival_chance(None, 0.1) is None and arrival_chance(ArrivalLoad(0.0, 32, 32), 0.1) is None
    assert arrival_chance(ArrivalLoad(2.0, 32, 32, first_in_s=0.3), 0.1) is None  # its phase is declared
    assert arrival_chance(ArrivalLoad(2.47, 32, 32), 0.12) == pytest.approx(1 - math.exp(-2.47 * 0.12))  # 0.26
    assert arrival_chance(ArrivalLoad(2.0, 32, 32), None) == 1.0  # no first token within the run: a certainty
    assert arrival_chance(ArrivalLoad(2.0, 32, 32), 0.0) == 0.0
    prefill = COST.solo_ttft_s(1500, 2048)  # 0.125 s
    rate = 0.25 / prefill  # 2/s, the next arrival half a gap ahead: two prefills after the candidate's
    cfg = ForecastConfig()
    learnt = EngineState(NOW, SCHED, (), ArrivalLoad(rate, 32, 8), load_basis="learnt")
    [whale] = forecast(learnt, [Candidate(1500, 4)], FITTED, cfg)
    assert whale.expected.slowed == 0 and whale.expected.requests > 0 and whale.in_flight.requests == 0
    # admitted now, it holds the next arrival back for its prefill; one landing in the prefill's last short's TTFT
    # (the next one's without it: a 32-token step) waits less than that, not slowed 2x
    short = COST.solo_ttft_s(32, 2048)
    assert whale.arrival_chance == pytest.approx(1 - math.exp(-rate * (prefill - short)), rel=1e-6)  # 21 %
    # the runs harm nobody; the sum is the harm over the phase, rate x prefill^2 / 2 = prefill / 8
    assert whale.ttft_extra_sum_s == whale.expected.phase_extra_s == pytest.approx(prefill / 8, rel=1e-6)
    assert not whale.harmless(cfg) and whale.as_dict()["arrival_chance"] == whale.arrival_chance
    assert whale.harmless(replace(cfg, harmless_arrival_chance=0.25))  # the bound is a setting (above 1: off)
    # a small one is gone before the stream is likely to land: 16 tokens priced ~5 ms, a chance under 5 %
    [tiny] = forecast(learnt, [Candidate(16, 2)], FITTED, cfg)
    assert tiny.arrival_chance is not None and tiny.arrival_chance < cfg.harmless_arrival_chance and tiny.harmless(cfg)
    # the same stream declared with its phase: the runs place the next arrival where it is, after the prefill
    told = replace(learnt, load=ArrivalLoad(rate, 32, 8, first_in_s=0.5 / rate), load_basis="declared")
    [known] = forecast(told, [Candidate(1500, 4)], FITTED, cfg)
    assert known.arrival_chance is None and known.as_dict()["arrival_chance"] is None and known.harmless(cfg)
    assert known.ttft_extra_sum_s == known.expected.phase_extra_s == 0
    with pytest.raises(ValueError):
        ForecastConfig(harmless_arrival_chance=0.0)


def test_the_harm_over_an_unknown_phase_is_the_runs_plus_the_last_partial_gap_in_closed_form() -> None:
    """Arrivals evenly spaced at gap g, their phase unknown: averaged over it, those landing within an exposure E
    wait E minus their arrival, r E^2 / 2 in all; the runs place them at half a gap, g/2 + i g. The closed form
    is checked against the average over 2,000 phases of what evenly placed arrivals wait, minus the runs' own."""
    def waits(first: float, gap: float, exposure: float) -> float:
        return sum(max(exposure - (first + i * gap), 0.0) for i in range(int(exposure / gap) + 2))

    for rate, exposure in ((2.47, 0.12), (2.0, 0.25), (2.0, 0.4), (4.2, 1.03), (0.5, 0.1), (2.0, 0.5)):
        gap = 1 / rate
        phases = [(k + 0.5) / 2000 * gap for k in range(2000)]
        averaged = sum(waits(u, gap, exposure) for u in phases) / len(phases)
        assert averaged == pytest.approx(rate * exposure**2 / 2, rel=1e-4)
        want = averaged - waits(gap / 2, gap, exposure)
        assert phase_extra_s(ArrivalLoad(rate, 32, 32), exposure) == pytest.approx(want, abs=1e-6)
        assert 0 <= phase_extra_s(ArrivalLoad(rate, 32, 32), exposure) <= gap / 8 + 1e-12
    assert phase_extra_s(ArrivalLoad(2.0, 32, 32, first_in_s=0.1), 0.3) == 0  # a known phase: the runs' is right
    assert phase_extra_s(None, 0.3) == phase_extra_s(ArrivalLoad(0.0, 32, 32), 0.3) == 0
    assert phase_extra_s(ArrivalLoad(2.0, 32, 32), None) == 0
