"""The per-settle forecast cache: the same answers as a fresh forecast from the same state, one state snapshot
per settle, repeated candidates answered from it, and the caller's own load bypassing it."""

from __future__ import annotations

from pathlib import Path

from attrib_agent.attribution.forecast import ArrivalLoad, Candidate, ForecastConfig, forecast
from attrib_agent.attribution.forecast_cache import ForecastCache
from attrib_agent.attribution.forecast_state import engine_state, forecast_cost
from attrib_agent.events import RequestReceived
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

WHALE2 = Path(__file__).resolve().parents[2] / "fixtures" / "recordings" / "whale2"
CFG = ForecastConfig()
WHALE, SHORT = Candidate(4096, 512), Candidate(32, 32)


def fed_until_second_whale() -> AttributionPipeline:
    p = AttributionPipeline()
    for ev in ReplaySource(WHALE2).events():
        if isinstance(ev, RequestReceived) and "-w2-" in ev.request_id:
            return p
        p.feed(ev)
    raise AssertionError("whale2: w2 never arrives")


def test_cached_answers_equal_a_fresh_forecast_and_one_snapshot_serves_a_settle() -> None:
    p = fed_until_second_whale()
    cache = ForecastCache()
    got = cache.forecast(p, p.settles, [WHALE, SHORT], CFG)
    state = engine_state(p)
    assert got is not None and state is not None
    assert got[0] == state
    assert got[1] == forecast(state, [WHALE, SHORT], forecast_cost(p), CFG)
    again = cache.forecast(p, p.settles, [SHORT], CFG)
    assert again is not None and again[1][0] is got[1][1]  # answered from the snapshot, not re-simulated
    assert cache.built == 1
    p.settle()
    fresh = cache.forecast(p, p.settles, [WHALE], CFG)
    assert cache.built == 2 and fresh is not None and fresh[1][0] is not got[1][0]


def test_answers_are_bounded_and_a_declared_load_gets_its_own_state() -> None:
    p = fed_until_second_whale()
    cache = ForecastCache(max_answers=2)
    for n in (100, 200, 300):
        cache.forecast(p, p.settles, [Candidate(n, 8)], CFG)
    snap = cache._snap
    assert snap is not None and list(snap.answers) == [Candidate(200, 8), Candidate(300, 8)]
    load = ArrivalLoad(2.0, 32, 32, 0.1)
    own = cache.forecast(p, p.settles, [WHALE], CFG, load=load)
    assert own is not None and own[0].load == load and cache.built == 1
    assert WHALE not in snap.answers


def test_no_state_before_any_event() -> None:
    assert ForecastCache().forecast(AttributionPipeline(), 0, [WHALE], CFG) is None


def test_new_candidates_on_a_kept_baseline_are_answered_as_fresh_forecasts() -> None:
    """The snapshot's `Baseline` (the run without a candidate, expected arrivals, ids) serves every later new
    candidate: each answer is the one a forecast from scratch gives, and the snapshot is built once."""
    p = fed_until_second_whale()
    cache = ForecastCache()
    cache.forecast(p, p.settles, [WHALE], CFG)
    state = engine_state(p)
    assert state is not None and state.load is not None and state.load.rate_per_s > 0  # expected arrivals too
    for c in (SHORT, Candidate(9000, 64), Candidate(2000, 10, cached_prefix_tokens=1920), Candidate(600, 900)):
        got = cache.forecast(p, p.settles, [c], CFG)
        assert got is not None and got[1] == forecast(state, [c], forecast_cost(p), CFG)
    assert cache.built == 1
