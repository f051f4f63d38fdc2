"""Causes of a queued victim in vLLM's terms, from hand-built steps: who is the head of the queue after a multi-victim
preemption, what that head needs to be admitted, and which phase the first token's own step belongs to."""

from __future__ import annotations

from attrib_agent.attribution.causes import EngineView, SharedBlocks, observed_causes
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.timeline.model import RequestLifecycle, StepMember, StepRecord
from attrib_agent.timeline.preemption import InferredPreemption
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome

COST = StepCostModel(StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.001, per_decode_request_s=0.001,
                                   per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
        per_prefill_request_s=0.0))


def step(iteration: int, end: float, *members: StepMember) -> StepRecord:
    ctx = sum(m.tokens for m in members if m.phase != "decode")
    gen = sum(m.tokens for m in members if m.phase == "decode")
    return StepRecord(0, iteration, end, 0.1, sum(m.phase != "decode" for m in members), ctx,
                      sum(m.phase == "decode" for m in members), gen, 0.9, members)


def view(steps: list[StepRecord], lcs: list[RequestLifecycle], preemptions: list[InferredPreemption],
         pool: int) -> EngineView:
    return EngineView(steps, {lc.request_id: lc for lc in lcs}, preemptions, pool, 16, 2048, Pricer(COST))


def test_the_head_after_a_preemption_is_the_last_victim_and_needs_what_it_held() -> None:
    """vLLM preempts the most recently admitted first (b) and puts each victim back at the front of the queue, so a,
    preempted last, is the head; it must bring back the 40 tokens it held (3 blocks), more than the 2 free. The
    victim v, waiting behind it, reads kv_pressure on the holders and head_of_line on a (not b; and not a
    contention: a guess of a's output from its span's timings, 8 + 16 tokens, would fit in the 2 free blocks)."""
    w, x = StepMember("w", "decode", 1, 96, 6), StepMember("x", "decode", 1, 30, 2)
    steps = [step(1, 0.1, w, x, StepMember("a", "decode", 1, 40, 3), StepMember("b", "decode", 1, 20, 2)),
             step(2, 0.2, w, StepMember("x", "prefill", 64, 80, 5)),
             step(3, 0.3, w, StepMember("x", "decode", 1, 81, 6))]
    lcs = [RequestLifecycle("a", arrival_ts=-1.0, scheduled_ts=-1.0, first_token_ts=-0.9, finish_ts=5.0,
                            prompt_tokens=8, completion_tokens=100, complete=True),
           RequestLifecycle("b", arrival_ts=-0.5, scheduled_ts=-0.5, first_token_ts=-0.4, finish_ts=5.0,
                            prompt_tokens=8, completion_tokens=100, complete=True),
           RequestLifecycle("v", arrival_ts=0.1, scheduled_ts=1.0, first_token_ts=1.1, finish_ts=1.5,
                            prompt_tokens=8, completion_tokens=10, complete=True)]
    dropped = [InferredPreemption(r, 2, 0.1, None, None, 1.0, ("count_gap",)) for r in ("b", "a")]  # vLLM's order
    got = observed_causes(lcs[2], view(steps, lcs, dropped, pool=14))
    assert got is not None
    ttft = got.weights["ttft"]
    assert set(ttft) == {"w", "x", "a"}, dict(ttft)
    assert set(ttft["a"]) == {"head_of_line"} and set(ttft["w"]) == {"kv_pressure"}
    assert ttft["a"]["head_of_line"] == ttft["w"]["kv_pressure"] + ttft["x"]["kv_pressure"]


def test_the_first_tokens_own_step_is_ttft_though_its_line_lands_after_the_token() -> None:
    """v's prompt ran in the step beside c's prefill chunk; the step's log line is stamped 3 ms after v's first
    token (the span's). c's chunk delayed v's first token: TTFT, not ITL."""
    c = StepMember("c", "prefill", 512, 512, 32)
    steps = [step(1, 0.203, c, StepMember("v", "prefill", 8, 8, 1)),
             step(2, 0.3, StepMember("c", "decode", 1, 513, 33), StepMember("v", "decode", 1, 9, 1))]
    lcs = [RequestLifecycle("v", arrival_ts=0.1, scheduled_ts=0.103, first_token_ts=0.2, finish_ts=0.3,
                            prompt_tokens=8, completion_tokens=2, complete=True),
           RequestLifecycle("c", arrival_ts=0.0, scheduled_ts=0.0, prompt_tokens=2048, complete=False)]
    got = observed_causes(lcs[0], view(steps, lcs, [], pool=100))
    assert got is not None
    assert set(got.weights["ttft"]["c"]) == {"prefill_contention"}
    assert set(got.weights["itl"]["c"]) == {"decode_batching"}


def test_shared_prefix_blocks_are_free_once_and_weigh_by_what_each_holds_alone() -> None:
    """r and h share r's 6-block prefix (h hit it): together they use 7 + 7 - 6 = 8 blocks of the 12 usable, so a
    2-block prompt fits: v queued behind the token budget, not KV (counting the copy twice left 0 free). With a
    4-block prompt it does not fit, and the KV pressure is on each holder by its own blocks: r and h 1 each, the
    prefilling w its 2 (the 6-block copy is nobody's alone)."""
    r, h = StepMember("r", "decode", 1, 100, 7), StepMember("h", "decode", 1, 100, 7)
    for prompt, want in ((24, {"r", "h"}), (56, {"r", "h", "w"})):
        w = StepMember("w", "prefill", 2048 - 2, 2048 - 2 + 16, 2 if prompt == 56 else 0)
        steps = [step(1, 0.2, r, h, w)]
        lcs = [RequestLifecycle("v", arrival_ts=0.1, scheduled_ts=0.5, first_token_ts=0.6, finish_ts=0.7,
                                prompt_tokens=prompt, completion_tokens=2, complete=True)]
        shared = {(1, 0.2): ({"r": 1, "h": 1, "w": 2}, 6)}
        v = EngineView(steps, {lc.request_id: lc for lc in lcs}, [], 13, 16, 2048, Pricer(COST), None, shared)
        got = observed_causes(lcs[0], v)
        assert got is not None
        ttft = got.weights["ttft"]
        if prompt == 24:  # 13 - 1 - (7 + 7 + 0) + 6 = 4 free >= 2 needed: the full budget held it
            assert not any("kv_pressure" in c for c in ttft.values()), dict(ttft)
        else:  # 13 - 1 - 16 + 6 = 2 free < 4 needed
            assert set(ttft) == want and all(set(c) == {"kv_pressure"} for c in ttft.values()), dict(ttft)
            assert ttft["w"]["kv_pressure"] == 2 * ttft["r"]["kv_pressure"] == 2 * ttft["h"]["kv_pressure"]


def test_shared_blocks_are_each_steps_own_split_read_on_demand() -> None:
    """engine_view no longer walks every step's split each pass: `SharedBlocks` reads a step's (once worked out)
    split when a victim asks, and gives what the walk gave: each holder's own blocks and the blocks counted twice,
    for the steps that share any; the causes are the same."""
    r, h = StepMember("r", "decode", 1, 100, 7), StepMember("h", "decode", 1, 100, 7)
    w = StepMember("w", "prefill", 2048 - 2, 2048 - 2 + 16, 2)
    shared_step, plain_step = step(1, 0.2, r, h, w), step(2, 0.3, r, h)

    def outcome(rec: StepRecord, shares: tuple[tuple[str, str, int], ...]) -> tuple[StepInput, StepOutcome]:
        si = StepInput(rec.iteration, 0, rec.iteration, rec.end_ts, rec.elapsed_s, 0, 0, 0, 0, 0.9)
        return si, StepOutcome(rec, holdings=tuple((m.request_id, m.blocks) for m in rec.members), prefix_shares=shares)

    outcomes = [outcome(shared_step, (("h", "r", 6),)), outcome(plain_step, ())]
    blocks = SharedBlocks(outcomes)
    assert dict(blocks) == {(1, 0.2): ({"r": 1, "h": 1, "w": 2}, 6)} and len(blocks) == 1
    assert blocks.get((2, 0.3)) is None and (2, 0.3) not in blocks and blocks.get((9, 9.0), "x") == "x"
    lcs = [RequestLifecycle("v", arrival_ts=0.1, scheduled_ts=0.5, first_token_ts=0.6, finish_ts=0.7,
                            prompt_tokens=56, completion_tokens=2, complete=True)]
    by_walk, by_split = (EngineView([shared_step], {"v": lcs[0]}, [], 13, 16, 2048, Pricer(COST), None, shared)
                         for shared in (dict(blocks), blocks))
    assert by_split.kv(shared_step) == ({"r": 1.0, "h": 1.0, "w": 2.0}, 6)
    walked, split = observed_causes(lcs[0], by_walk), observed_causes(lcs[0], by_split)
    assert walked is not None and split is not None and walked.weights == split.weights
    assert set(split.weights["ttft"]) == {"r", "h", "w"}
