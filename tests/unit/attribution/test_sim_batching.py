"""The simulator's batching options give each request exactly what a run of its own gives it: tracing several
requests in one run, and stopping once the requests read have finished (real recordings)."""

from __future__ import annotations

import pytest

from attrib_agent.attribution.scheduler_sim import simulate

from .recorded import fitted_cost, load

NAMES = ("whale1", "whale2", "preempt")


@pytest.mark.parametrize("name", NAMES)
def test_tracing_many_in_one_run_equals_tracing_each_alone(name: str) -> None:
    rec = load(name)
    reqs, cost = rec.requests, fitted_cost(rec)
    traced = [r.request_id for r in reqs[::3]]
    together = simulate(reqs, rec.config, cost, trace=traced)
    plain = simulate(reqs, rec.config, cost)
    for rid in traced:
        alone = simulate(reqs, rec.config, cost, trace=rid).outcomes[rid]
        assert together.outcomes[rid] == alone
        assert alone.waits  # these requests waited: the comparison is not of empty traces
    for rid, o in together.outcomes.items():  # tracing only observes
        if rid not in traced:
            assert o.waits == ()
        assert (o.first_token_ts, o.finish_ts, o.token_ts) == (plain.outcomes[rid].first_token_ts,
                                                                plain.outcomes[rid].finish_ts,
                                                                plain.outcomes[rid].token_ts)


@pytest.mark.parametrize("name", NAMES)
def test_stopping_when_the_awaited_have_finished_keeps_their_outcomes(name: str) -> None:
    rec = load(name)
    reqs, cost = rec.requests, fitted_cost(rec)
    full = simulate(reqs, rec.config, cost)
    first = min(reqs, key=lambda r: r.arrival_ts).request_id
    finished = sorted((o.finish_ts, rid) for rid, o in full.outcomes.items() if o.finish_ts is not None)
    early = [rid for _, rid in finished[:4]]
    cut = simulate(reqs, rec.config, cost, trace=early, until_done=early)
    assert cut.steps < full.steps
    for rid in early:
        assert cut.outcomes[rid].finish_ts is not None
        assert (cut.outcomes[rid].token_ts, cut.outcomes[rid].scheduled_ts) == \
            (full.outcomes[rid].token_ts, full.outcomes[rid].scheduled_ts)
        assert cut.outcomes[rid].waits == simulate(reqs, rec.config, cost, trace=rid).outcomes[rid].waits
    assert simulate(reqs, rec.config, cost, until_done=[]).steps == 0
    assert simulate(reqs, rec.config, cost, until_done=[first]).outcomes[first] == full.outcomes[first]
    with pytest.raises(ValueError, match="not among"):
        simulate(reqs, rec.config, cost, until_done=["nobody"])
