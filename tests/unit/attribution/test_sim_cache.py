"""Runs shared across victims and settles: bounded, reused only where the answer is exact, and priced by a cost
version that a refit moves only when its prices moved past the tolerance."""

from __future__ import annotations

import pytest

from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_cache import CostVersions, FrozenCost, RunCache
from attrib_agent.attribution.sim_types import InProgress, SchedulerConfig, SimRequest, SimStart

SCHED = SchedulerConfig(block_size=16, num_blocks=257, token_budget=256)
PRIOR = StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.001, per_decode_request_s=0.001,
                      per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
        per_prefill_request_s=0.0)
PRIOR_MODEL = StepCostModel(PRIOR)


def reqs() -> list[SimRequest]:
    return [SimRequest("a", 0.0, 100, 20), SimRequest("b", 0.05, 50, 5), SimRequest("c", 5.0, 30, 5)]


def key(version: int = 1, removed: frozenset[str] = frozenset()) -> tuple[object, ...]:
    return RunCache.key(None, SCHED, version, removed, 0.0)


def test_a_run_answers_readers_that_finished_in_it_when_the_arrivals_before_them_match() -> None:
    cache = RunCache(8)
    rs = reqs()
    run = simulate(rs, SCHED, PRIOR_MODEL, until_done=["b"])
    assert run.outcomes["b"].finish_ts is not None and run.outcomes["a"].finish_ts is None  # stopped at b
    cache.put(key(), rs, run, ())
    assert cache.get(key(), rs, ["b"]) is run and cache.hits == 1
    # a later arrival (after b finished) cannot reach back: still exact
    assert cache.get(key(), [*rs, SimRequest("d", 3.0, 10, 2)], ["b"]) is run
    # a reader the run stopped before, an arrival before b's finish that differs, another key: misses
    assert cache.get(key(), rs, ["a"]) is None
    assert cache.get(key(), [rs[0], SimRequest("b", 0.05, 50, 6), rs[2]], ["b"]) is None
    assert cache.get(key(version=2), rs, ["b"]) is None
    assert (cache.hits, cache.misses) == (2, 3)


def test_a_world_without_a_request_arriving_after_the_readers_finished_is_the_run_with_it() -> None:
    cache = RunCache(8)
    rs = reqs()
    run = simulate(rs, SCHED, PRIOR_MODEL, until_done=["b"])
    cache.put(key(), rs, run, ())
    # c arrives at 5 s, after b finished: removing it cannot change b's outcome
    assert cache.get(key(removed=frozenset({"c"})), rs[:2], ["b"]) is run
    alone = simulate(rs[1:], SCHED, PRIOR_MODEL, until_done=["b"])
    # a arrived before b finished: removing it is another world
    assert cache.get(key(removed=frozenset({"a"})), rs[1:], ["b"]) is None
    assert alone.outcomes["b"].finish_ts != run.outcomes["b"].finish_ts


def test_requests_removed_from_the_start_state_make_another_run() -> None:
    start = SimStart(0.1, (InProgress("a", 100, 1, True, 7, 0.0, 0.1),))
    rs = reqs()
    full = RunCache.key(start, SCHED, 1, frozenset(), 0.0)
    assert RunCache.key(start, SCHED, 1, frozenset({"c"}), 0.0) == full  # c was not on the engine at the start
    assert RunCache.key(start, SCHED, 1, frozenset({"a"}), 0.0) != full
    cache = RunCache(8)
    run = simulate(rs, SCHED, PRIOR_MODEL, until_done=["b"], start=start)
    cache.put(full, rs, run, ())
    assert cache.get(RunCache.key(start, SCHED, 1, frozenset({"a"}), 0.0), rs[1:], ["b"]) is None


def test_a_traced_run_answers_only_for_the_requests_it_traced() -> None:
    cache = RunCache(8)
    rs = reqs()
    run = simulate(rs, SCHED, PRIOR_MODEL, trace=["b"], until_done=["a", "b"])
    k = RunCache.key(None, SCHED, 1, frozenset(), 0.0)
    cache.put(k, rs, run, ["b"])
    assert cache.get(k, rs, ["b"], traced=True) is run
    assert cache.get(k, rs, ["a"], traced=True) is None  # finished in it, but its waits were not traced
    assert cache.get(k, rs, ["a"]) is run  # its outcome is all an untraced question reads
    untraced = RunCache(8)
    untraced.put(k, rs, simulate(rs, SCHED, PRIOR_MODEL, until_done=["a", "b"]), ())
    assert untraced.get(k, rs, ["b"], traced=True) is None


def test_the_cache_is_bounded_least_recently_used_first() -> None:
    cache = RunCache(3)
    rs = reqs()
    run = simulate(rs, SCHED, PRIOR_MODEL, until_done=["b"])
    for v in range(5):
        cache.put(key(version=v), rs, run, ())
        cache.get(key(version=2), rs, ["b"])  # kept in use
    assert len(cache) == 3
    assert cache.get(key(version=0), rs, ["b"]) is None and cache.get(key(version=1), rs, ["b"]) is None
    assert cache.get(key(version=2), rs, ["b"]) is run and cache.get(key(version=4), rs, ["b"]) is run
    off = RunCache(0)
    off.put(key(), rs, run, ())
    assert len(off) == 0


def test_a_refit_moves_the_version_only_when_its_prices_moved_past_the_tolerance() -> None:
    model = StepCostModel(PRIOR, min_steps=8, refit_every=8)
    versions = CostVersions(0.02)
    first = versions.current(model)
    assert versions.version == 1 and versions.current(model) is first
    for _ in range(8):  # steps that cost what the prior says: the refit lands (nearly) where it was
        model.observe(64, 4, 400, PRIOR.intercept_s + 64 * PRIOR.per_prefill_token_s + 4 * PRIOR.per_decode_request_s)
        model.observe(0, 8, 800, PRIOR.intercept_s + 8 * PRIOR.per_decode_request_s)
    assert model.fitted
    assert versions.current(model) is first and versions.version == 1
    for _ in range(64):  # an engine twice as slow: every run priced before is another run now
        model.observe(64, 4, 400, 2 * (PRIOR.intercept_s + 64 * PRIOR.per_prefill_token_s
                                       + 4 * PRIOR.per_decode_request_s))
        model.observe(0, 8, 800, 2 * (PRIOR.intercept_s + 8 * PRIOR.per_decode_request_s))
    moved = versions.current(model)
    assert versions.version == 2 and moved != first
    assert moved.step_seconds(64, 4, 400) == pytest.approx(model.step_seconds(64, 4, 400))
    with pytest.raises(ValueError):
        CostVersions(-0.1)


def test_frozen_prices_are_the_models_own() -> None:
    model = StepCostModel(PRIOR)
    frozen = FrozenCost.of(model)
    for args in ((0, 1, 100, 0), (512, 3, 900, 5000), (2048, 0, 0, 2_000_000)):
        assert frozen.step_seconds_with_prefill(*args) == pytest.approx(model.step_seconds_with_prefill(*args))

