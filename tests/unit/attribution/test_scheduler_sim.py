"""The scheduler re-simulation on small synthetic cases whose outcome can be worked out by hand."""

from __future__ import annotations

import pytest

from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.scheduler_sim import shapley, simulate, slowdown_shares
from attrib_agent.attribution.shapley import shapley_values
from attrib_agent.attribution.sim_trace import Member, Pricer, VictimTracer, VictimView
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest, SimResult, WaitCause

BS = 16
# 10 ms per step, +1 ms per prefill token, +1 ms per decoding request: easy to add up by hand.
COST = StepCostModel(StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.001, per_decode_request_s=0.001,
                                   per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
        per_prefill_request_s=0.0))


def config(blocks: int = 64, budget: int = 64, prefix_caching: bool = True) -> SchedulerConfig:
    return SchedulerConfig(block_size=BS, num_blocks=blocks + 1, token_budget=budget,  # + vLLM's null block
                           prefix_caching=prefix_caching)


def req(rid: str, arrival: float, prompt: int, output: int) -> SimRequest:
    return SimRequest(rid, arrival, prompt, output)


def waits_by(result: SimResult, rid: str, cause: str) -> dict[str, float]:
    out: dict[str, float] = {}
    for w in result.outcomes[rid].waits:
        if w.cause == cause:
            for k, v in w.by_request:
                out[k] = out.get(k, 0.0) + v
    return out


def test_alone_a_request_gets_its_solo_ttft_and_itl() -> None:
    res = simulate([req("a", 1.0, 100, 5)], config(), COST, trace="a")
    o = res.outcomes["a"]
    assert o.queued_ts == o.scheduled_ts == 1.0
    assert o.ttft_s(1.0) == pytest.approx(COST.solo_ttft_s(100, 64)) == pytest.approx(0.074 + 0.046)
    assert len(o.token_ts) == 5 and o.finish_ts == o.token_ts[-1]
    assert o.mean_itl_s == pytest.approx(COST.solo_itl_s(101)) == pytest.approx(0.011)
    assert o.waits == () and res.preemptions == 0 and res.steps == 2 + 4
    assert res.peak_step_tokens == 64 and res.peak_kv_blocks == 7  # 104 tokens at the end: 7 blocks of 16


def test_a_request_arriving_mid_step_waits_for_the_step_in_flight() -> None:
    res = simulate([req("a", 0.0, 64, 3), req("b", 0.03, 16, 2)], config(), COST, trace="b")
    b = res.outcomes["b"]
    assert b.queued_ts == b.scheduled_ts == pytest.approx(0.074)  # vLLM picks requests up between steps
    assert b.ttft_s(0.03) == pytest.approx(0.044 + (0.01 + 0.016 + 0.001))
    assert waits_by(res, "b", "prefill_contention") == pytest.approx({"a": 0.044})
    assert waits_by(res, "b", "decode_batching")["a"] == pytest.approx(0.001 + 0.001)  # shared steps, a decoding
    first = b.first_token_ts
    assert first is not None
    ttft_waits = sum(w.seconds for w in b.waits if w.ts is not None and w.ts < first)
    assert b.ttft_s(0.03) == pytest.approx(COST.solo_ttft_s(16, 64) + ttft_waits)


def test_full_prompt_reservation_and_head_of_line_blocking() -> None:
    # 10 blocks of 16 tokens. `a` holds 7 then 8 blocks; `b` needs 4 for its whole prompt, so it waits for
    # `a` to finish (kv_pressure); `c` needs only 1 block but queues behind `b` (head-of-line), FCFS.
    requests = [req("a", 0.0, 100, 20), req("b", 0.05, 64, 2), req("c", 0.06, 8, 2)]
    res = simulate(requests, config(blocks=10, budget=128), COST, trace="c")
    a, b, c = (res.outcomes[k] for k in "abc")
    assert a.finish_ts is not None and b.scheduled_ts is not None and c.scheduled_ts is not None
    assert b.scheduled_ts == pytest.approx(a.finish_ts)  # admitted the step after `a` freed its blocks
    assert c.scheduled_ts == pytest.approx(b.scheduled_ts)  # same step, right behind `b`
    hol = waits_by(res, "c", "head_of_line")
    assert set(hol) == {"b"} and hol["b"] > 0.1
    res_b = simulate(requests, config(blocks=10, budget=128), COST, trace="b")
    assert set(waits_by(res_b, "b", "kv_pressure")) == {"a"}
    assert res.preemptions == 0 and res.peak_kv_blocks <= 10


def test_preemption_recomputes_the_most_recently_admitted() -> None:
    # Both fit when admitted (4 + 4 of 10 blocks) but grow to 8 + 8: the later one is preempted, recomputes.
    requests = [req("a", 0.0, 64, 60), req("b", 0.001, 64, 60)]
    res = simulate(requests, config(blocks=10, budget=128), COST, trace="b")
    a, b = res.outcomes["a"], res.outcomes["b"]
    assert a.preemptions == 0 and b.preemptions >= 1 and res.preemptions == a.preemptions + b.preemptions
    assert len(b.token_ts) == 60 and b.token_ts == tuple(sorted(b.token_ts))  # no token emitted twice
    assert set(waits_by(res, "b", "preemption")) == {"a"}
    assert res.peak_kv_blocks <= 10
    no_cache = simulate(requests, config(blocks=10, budget=128, prefix_caching=False), COST)
    assert no_cache.preemptions >= 1
    b_nc = no_cache.outcomes["b"].finish_ts
    assert b.finish_ts is not None and b_nc is not None and b.finish_ts <= b_nc  # cached blocks spare recompute


def test_a_request_that_cannot_fit_is_refused_and_the_rest_run() -> None:
    requests = [req("huge", 0.0, 150, 20), req("ok", 0.0, 16, 2)]  # 169 tokens > 10 blocks of 16
    res = simulate(requests, config(blocks=10), COST)
    huge, ok = res.outcomes["huge"], res.outcomes["ok"]
    assert huge.scheduled_ts is None and huge.first_token_ts is None and huge.token_ts == ()
    assert ok.finish_ts is not None and ok.ttft_s(0.0) == pytest.approx(COST.solo_ttft_s(16, 64))


def test_ties_keep_input_order_and_steps_are_bounded() -> None:
    res = simulate([req("x", 0.0, 64, 4), req("y", 0.0, 64, 4)], config(budget=64), COST)
    x, y = res.outcomes["x"], res.outcomes["y"]
    assert x.scheduled_ts is not None and y.scheduled_ts is not None and x.scheduled_ts < y.scheduled_ts
    short = simulate([req("x", 0.0, 64, 400)], config(), COST, max_steps=3)
    assert short.steps == 3 and short.outcomes["x"].finish_ts is None and len(short.outcomes["x"].token_ts) == 3


def test_idle_time_jumps_to_the_next_arrival() -> None:
    res = simulate([req("a", 0.0, 16, 1), req("b", 50.0, 16, 1)], config(), COST)
    assert res.outcomes["b"].scheduled_ts == 50.0 and res.steps == 2


def test_rejects_bad_input() -> None:
    with pytest.raises(ValueError):
        simulate([req("a", 0, 1, 1), req("a", 1, 1, 1)], config(), COST)
    with pytest.raises(ValueError):
        simulate([req("a", 0, 1, 1)], config(), COST, trace="zzz")
    with pytest.raises(ValueError):
        simulate([], SchedulerConfig(block_size=16, num_blocks=1), COST)
    assert simulate([], config(), COST).steps == 0


def test_free_queue_evicts_least_recently_freed_and_reuses_cached_prefixes() -> None:
    q = FreeBlockQueue(10)
    q.allocate(6)  # request 1 takes 6 (4 full, partial tail), request 2 takes 4
    q.allocate(4)
    q.release(1, 6, full_blocks=4)
    assert q.free == 6
    q.allocate(1)  # takes request 1's partial tail first (freed tail-first, like vLLM)
    assert q.take_cached(1, 10) == 4 and q.free == 1
    q.release(2, 4, full_blocks=4)
    q.allocate(3)  # evicts 1 free block, then request 2's highest blocks: its prefix 0..1 survives
    assert q.take_cached(2, 10) == 2 and q.free == 0
    assert q.take_cached(2, 10) == 0
    with pytest.raises(ValueError):
        q.allocate(1)
    no_cache = FreeBlockQueue(4, prefix_caching=False)
    no_cache.allocate(4)
    no_cache.release(7, 4, full_blocks=4)
    assert no_cache.take_cached(7, 4) == 0 and no_cache.free == 4 and len(no_cache) == 1


def test_shapley_exact_matches_the_lab_and_sampling_is_deterministic_and_efficient() -> None:
    def game(s: frozenset[str]) -> float:
        return sum(ord(p[-1]) % 5 for p in s) + 3.0 * ({"p1", "p2"} <= s)

    few = ["p1", "p2", "p3"]
    assert shapley(few, game) == pytest.approx(shapley_values(few, game))
    many = [f"p{i}" for i in range(1, 10)]
    a = shapley(many, game, permutations=40, seed=3)
    assert a == shapley(many, game, permutations=40, seed=3)
    assert sum(a.values()) == pytest.approx(game(frozenset(many)) - game(frozenset()))
    exact = shapley(many, game, exact_up_to=12)
    assert max(abs(a[p] - exact[p]) for p in many) < 0.6
    with pytest.raises(ValueError):
        shapley(["a", "a"], game)


def test_two_whales_that_only_hurt_together_share_the_blame() -> None:
    # 20 blocks of 16: w1 (10 -> 13 blocks) or w2 (8 -> 11) fits beside the short; together they fill the
    # pool, so the short, arriving later, cannot be admitted until one of them finishes.
    requests = [req("w1", 0.0, 160, 40), req("w2", 0.001, 128, 40), req("s", 0.3, 16, 4)]
    shares, runs = slowdown_shares(requests, config(blocks=20, budget=64), COST, "s", {"w1": ["w1"], "w2": ["w2"]})
    both = runs[frozenset({"w1", "w2"})]
    assert both > 0.2 and runs[frozenset({"w1"})] < 0.05 and runs[frozenset({"w2"})] < 0.05
    assert sum(shares.values()) == pytest.approx(both)
    assert min(shares.values()) > 0.3 * both
    traced = simulate(requests, config(blocks=20, budget=64), COST, trace="s")
    assert set(waits_by(traced, "s", "kv_pressure")) == {"w1", "w2"}
    assert all(isinstance(w, WaitCause) and w.seconds > 0 for w in traced.outcomes["s"].waits)
    itl_shares, _ = slowdown_shares(requests, config(blocks=20, budget=64), COST, "s",
                                    {"w1": ["w1"], "w2": ["w2"]}, metric="itl")
    assert set(itl_shares) == {"w1", "w2"} and all(v == v for v in itl_shares.values())
    with pytest.raises(ValueError):
        slowdown_shares(requests, config(), COST, "nobody", {})
    with pytest.raises(ValueError):
        slowdown_shares(requests, config(), COST, "s", {}, metric="e2e")


def test_traced_waits_stay_bounded_over_a_long_life() -> None:
    pricer = Pricer(COST)
    tracer = VictimTracer("v", pricer)
    view = VictimView(0.0, True, False, False, False, ())
    for i in range(500):  # a different batch every step: one entry per (cause, phase) all the same
        others = [Member(f"o{i}", 1, 100, True), Member(f"p{i % 7}", 8, 0, False)]
        tracer.step(float(i), i + 0.5, others, "budget", None, (), [], view)
    waits = tracer.waits()
    assert len(waits) <= 3  # one entry per contention cause (one phase here)
    assert {"prefill_contention", "decode_batching"} <= {w.cause for w in waits}
    assert {rid for w in waits if w.cause == "prefill_contention" for rid, _ in w.by_request} == {
        f"p{k}" for k in range(7)}
    assert sum(w.seconds for w in waits) == pytest.approx(500 * 0.5)
