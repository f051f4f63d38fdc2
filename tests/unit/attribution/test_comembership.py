"""When no re-simulated world shows a whale to matter to a victim, what the re-simulation missed of its wait goes to
the whales its observed steps held, by what each cost there (`VictimCauses.shares`, docs/attribution.md "Eleventh
session (seen13)"): never to a whale in none of its steps, far less to one decoding a token than to a chunk that
filled the step, and the light crowd's part stays unexplained."""

from __future__ import annotations

import pytest

from attrib_agent.attribution.causes import EngineView, observed_causes
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.shapley import even_split, split_by, with_shortfall
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.timeline.model import RequestLifecycle, StepMember, StepRecord

COST = StepCostModel(StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.00005, per_decode_request_s=0.001,
                                   per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
                                   per_prefill_request_s=0.0))


def step(iteration: int, end: float, elapsed: float, *members: StepMember) -> StepRecord:
    ctx = sum(m.tokens for m in members if m.phase != "decode")
    gen = sum(m.tokens for m in members if m.phase == "decode")
    return StepRecord(0, iteration, end, elapsed, sum(m.phase != "decode" for m in members), ctx,
                      sum(m.phase == "decode" for m in members), gen, 0.5, members)


def lifecycle(rid: str, arrival: float, first: float, finish: float, prompt: int, out: int) -> RequestLifecycle:
    return RequestLifecycle(rid, arrival_ts=arrival, scheduled_ts=arrival, first_token_ts=first, finish_ts=finish,
                            prompt_tokens=prompt, completion_tokens=out, complete=True)


def whale2_like() -> tuple[RequestLifecycle, EngineView]:
    """s002's case in whale2 (docs/attribution.md "Eleventh session (truth13)"): v arrives during a step of w1's
    decode, misses the next one, and runs in the step with w2's first 2,015-token chunk (w1 decoding a token beside
    them, and a light request l too); a third whale w3 ran only before v came."""
    w1 = StepMember("w1", "decode", 1, 3000, 188)
    steps = [step(1, 0.095, 0.01, StepMember("w3", "decode", 1, 4000, 250)),
             step(2, 0.105, 0.007, w1),
             step(3, 0.112, 0.007, w1),
             step(4, 0.190, 0.078, w1, StepMember("v", "prefill", 32, 32, 2),
                  StepMember("w2", "prefill", 2015, 2015, 126), StepMember("l", "decode", 1, 40, 3)),
             step(5, 0.200, 0.010, w1, StepMember("v", "decode", 1, 33, 3), StepMember("l", "decode", 1, 41, 3))]
    lcs = [lifecycle("v", 0.1, 0.19, 0.2, 32, 2), lifecycle("w1", 0.0, 0.05, 0.5, 3000, 600),
           lifecycle("w2", 0.108, 0.3, 0.6, 5000, 10), lifecycle("w3", 0.0, 0.01, 0.096, 4000, 5),
           lifecycle("l", 0.09, 0.11, 0.3, 40, 20)]
    return lcs[0], EngineView(steps, {lc.request_id: lc for lc in lcs}, [], 4096, 16, 2048, Pricer(COST))


def test_the_chunk_that_filled_the_step_takes_far_more_than_a_decode_beside_it() -> None:
    victim, view = whale2_like()
    got = observed_causes(victim, view)
    assert got is not None
    shares = got.shares("ttft", {"w1": ["w1"], "w2": ["w2"], "w3": ["w3"]})
    assert "w3" not in shares  # in none of v's steps: nothing, however big
    assert shares["w2"] > 3 * shares["w1"] > 0  # a 2,015-token chunk against a token a step (and the two waits)
    # the fractions are each whale's seconds of v's observed wait over all co-members': what the causes price
    weights = got.weights["ttft"]
    total = sum(sum(by.values()) for by in weights.values())
    for w in ("w1", "w2"):
        assert shares[w] == pytest.approx(sum(weights[w].values()) / total, rel=1e-12)
    assert 0 < 1 - shares["w1"] - shares["w2"] == pytest.approx(sum(weights["l"].values()) / total, rel=1e-9)
    # ITL: v's one decode step held w1 and l, not w2 (still prefilling elsewhere, not in that step)
    assert set(got.shares("itl", {"w1": ["w1"], "w2": ["w2"]})) == {"w1"}


def test_an_n_seq_client_is_its_childrens_sum_and_nobody_in_no_step_gets_anything() -> None:
    victim, view = whale2_like()
    got = observed_causes(victim, view)
    assert got is not None
    alone = got.shares("ttft", {"w1": ["w1"], "w2": ["w2"]})
    as_one = got.shares("ttft", {"c": ["w1", "w2"]})
    assert as_one["c"] == pytest.approx(alone["w1"] + alone["w2"], rel=1e-12)
    assert got.shares("ttft", {"x": ["nobody"]}) == {}


def test_the_shortfall_by_fractions_leaves_the_rest_unexplained_and_an_even_split_is_unchanged() -> None:
    phi = {"w1": 0.001, "w2": 0.0, "w3": 0.002}
    got = with_shortfall(phi, split_by(0.08, {"w1": 0.15, "w2": 0.8}))
    assert got == pytest.approx({"w1": 0.001 + 0.012, "w2": 0.064, "w3": 0.002})
    assert sum(got.values()) - sum(phi.values()) == pytest.approx(0.08 * 0.95)  # the light crowd's 5 %: nobody's
    assert with_shortfall(phi, split_by(0.08, {})) == phi
    assert with_shortfall(phi, even_split(0.09, ["w1", "w3"])) == {"w1": 0.001 + 0.09 / 2, "w2": 0.0,
                                                                   "w3": 0.002 + 0.09 / 2}
