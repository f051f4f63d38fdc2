"""ITL causes between decoding requests, from hand-built steps: a running victim's co-members get the step's time
less the victim's own *share* of the step's price, as vLLM's steps are read (lab/cause_truth.py). Taking an
absolute price of the victim alone out of a step shorter than it (2 ms decode steps priced 3.2 ms) left the
co-decoder nothing, and its ITL blame read `other` (held-out mixed m029 <- m028, docs/attribution.md)."""

from __future__ import annotations

import pytest

from attrib_agent.attribution.causes import EngineView, observed_causes
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.timeline.model import RequestLifecycle, StepMember, StepRecord

INTERCEPT_S, PER_DECODE_S, PER_TOKEN_S, ELAPSED_S = 3e-3, 2e-4, 1e-5, 2e-3
COST = StepCostModel(StepCostPrior(intercept_s=INTERCEPT_S, per_prefill_token_s=PER_TOKEN_S,
                                   per_decode_request_s=PER_DECODE_S, per_decode_context_token_s=0.0,
                                   per_prefill_pair_s=0.0, step_gap_s=0.0, per_prefill_request_s=0.0))


def step(iteration: int, *members: StepMember, elapsed: float = ELAPSED_S) -> StepRecord:
    prefill = [m for m in members if m.phase != "decode"]
    return StepRecord(0, iteration, iteration * 0.01, elapsed, len(prefill), sum(m.tokens for m in prefill),
                      len(members) - len(prefill), len(members) - len(prefill), 0.1, members)


def causes(steps: list[StepRecord]) -> dict[str, dict[str, float]]:
    v = RequestLifecycle("v", arrival_ts=0.0, scheduled_ts=0.0, first_token_ts=0.001, finish_ts=1.0,
                         prompt_tokens=8, completion_tokens=len(steps) + 1, complete=True)
    view = EngineView(steps, {"v": v}, [], 1000, 16, 2048, Pricer(COST))
    got = observed_causes(v, view)
    assert got is not None
    return got.weights["itl"]


def test_a_decoding_neighbour_in_steps_shorter_than_the_victims_own_price_is_decode_batching() -> None:
    """Two decoders, 2 ms steps, each priced 3 + 0.2 ms alone: w added 0.2 of the steps' 3.4 ms, so 2/34 of each
    step is w's decode_batching (the old rule, 2 ms less 3.2 ms, gave w nothing)."""
    steps = [step(i, StepMember("v", "decode", 1, 10 + i, 1), StepMember("w", "decode", 1, 50 + i, 4))
             for i in range(1, 11)]
    itl = causes(steps)
    assert set(itl) == {"w"} and set(itl["w"]) == {"decode_batching"}
    share = PER_DECODE_S / (INTERCEPT_S + 2 * PER_DECODE_S)
    assert itl["w"]["decode_batching"] == pytest.approx(10 * ELAPSED_S * share)


def test_a_chunk_and_a_decoder_split_the_step_by_what_each_adds() -> None:
    """v decodes beside w's 256-token chunk (2.56 ms) and x's decode (0.2 ms) in a 6 ms step priced 5.96 ms: the
    others' part is the step less v's own share (3.2 / 5.96), split 256 : 20 between the chunk and the decode."""
    members = (StepMember("v", "decode", 1, 10, 1), StepMember("w", "prefill", 256, 256, 16),
               StepMember("x", "decode", 1, 30, 2))
    itl = causes([step(1, *members, elapsed=6e-3)])
    chunk, decode = 256 * PER_TOKEN_S, PER_DECODE_S
    full = INTERCEPT_S + chunk + 2 * decode
    others = 6e-3 * (1 - (INTERCEPT_S + decode) / full)
    assert itl["w"] == pytest.approx({"prefill_contention": others * chunk / (chunk + decode)})
    assert itl["x"] == pytest.approx({"decode_batching": others * decode / (chunk + decode)})
