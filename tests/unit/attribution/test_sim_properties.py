"""Invariants of the scheduler re-simulation over random small workloads (hypothesis)."""

from __future__ import annotations

from dataclasses import replace

from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.result import CAUSES
from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_step import blocks_for
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest

COSTS = [
    StepCostModel(StepCostPrior(intercept_s=0.01, per_prefill_token_s=0.001, per_decode_request_s=0.001,
                                per_decode_context_token_s=0.0, per_prefill_pair_s=0.0, step_gap_s=0.0,
        per_prefill_request_s=0.0)),
    StepCostModel(StepCostPrior()),  # the lab CPU prior: context and attention terms too
]


@st.composite
def workloads(draw: st.DrawFn) -> tuple[list[SimRequest], SchedulerConfig, int]:
    bs = draw(st.sampled_from([4, 8, 16]))
    config = SchedulerConfig(block_size=bs, num_blocks=draw(st.integers(4, 40)),
                             token_budget=draw(st.sampled_from([8, 16, 32, 64, 128])),
                             max_num_seqs=draw(st.integers(1, 8)), prefix_caching=draw(st.booleans()))
    n = draw(st.integers(1, 10))
    requests = [SimRequest(f"r{i}", draw(st.integers(0, 2000)) / 1000, draw(st.integers(1, 150)),
                           draw(st.integers(1, 30))) for i in range(n)]
    return requests, config, draw(st.integers(0, len(COSTS) - 1))


def fits(r: SimRequest, config: SchedulerConfig) -> bool:
    return blocks_for(r.prompt_tokens + r.output_tokens - 1, config.block_size) <= config.num_blocks - 1


@settings(max_examples=400, deadline=None)
@given(workloads())
def test_pool_budget_completion_fcfs_and_determinism(case: tuple[list[SimRequest], SchedulerConfig, int]) -> None:
    requests, config, which = case
    res = simulate(requests, config, COSTS[which], max_steps=200_000)
    assert res.peak_kv_blocks <= config.num_blocks - 1
    assert res.peak_step_tokens <= config.token_budget
    assert res.preemptions == sum(o.preemptions for o in res.outcomes.values())
    order = sorted(range(len(requests)), key=lambda i: (requests[i].arrival_ts, i))
    last_scheduled = float("-inf")
    for i in order:
        r, o = requests[i], res.outcomes[requests[i].request_id]
        if not fits(r, config):
            assert o.scheduled_ts is None and o.token_ts == ()
            continue
        assert o.finish_ts is not None and len(o.token_ts) == r.output_tokens
        assert list(o.token_ts) == sorted(o.token_ts) and o.first_token_ts == o.token_ts[0]
        assert o.queued_ts is not None and o.scheduled_ts is not None
        assert r.arrival_ts <= o.queued_ts <= o.scheduled_ts < o.first_token_ts <= o.finish_ts
        assert o.scheduled_ts >= last_scheduled  # first admissions follow arrival order (FCFS)
        last_scheduled = o.scheduled_ts
    assert simulate(requests, config, COSTS[which], max_steps=200_000) == res


@settings(max_examples=300, deadline=None)
@given(workloads(), st.data())
def test_traced_waits_are_well_formed_and_explain_the_ttft(case: tuple[list[SimRequest], SchedulerConfig, int],
                                                          data: st.DataObject) -> None:
    requests, config, which = case
    victim = data.draw(st.sampled_from(requests))
    cost = COSTS[which]
    res = simulate(requests, config, cost, trace=victim.request_id, max_steps=200_000)
    o = res.outcomes[victim.request_id]
    assert all(not res.outcomes[r.request_id].waits for r in requests if r.request_id != victim.request_id)
    if o.first_token_ts is None:
        assert o.waits == ()
        return
    for w in o.waits:
        assert w.cause in CAUSES and w.seconds > 0 and w.ts is not None
        assert abs(sum(s for _, s in w.by_request) - w.seconds) < 1e-9
        assert all(rid != victim.request_id and s > 0 for rid, s in w.by_request)
    ttft = o.ttft_s(victim.arrival_ts)
    assert ttft is not None
    ttft_waits = sum(w.seconds for w in o.waits if w.ts is not None and w.ts < o.first_token_ts)
    assert ttft_waits <= ttft + 1e-9
    if o.preemptions == 0:
        # Every second of the TTFT is either a wait or the victim's own (solo-priced) prefill work, which
        # costs at least its solo TTFT (sharing the budget only splits it into more chunks).
        assert ttft - ttft_waits >= cost.solo_ttft_s(victim.prompt_tokens, config.token_budget) - 1e-9


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 40), st.integers(1, 20)), min_size=2, max_size=6), st.data())
def test_removing_a_request_never_slows_a_batch_that_arrives_together(shapes: list[tuple[int, int]],
                                                                      data: st.DataObject) -> None:
    # Same arrival, every prompt in the first step, room for all: each step without the removed request
    # computes a subset of the same work, so with a monotone cost nobody else can get slower.
    requests = [SimRequest(f"r{i}", 0.0, p, o) for i, (p, o) in enumerate(shapes)]
    config = SchedulerConfig(block_size=8, num_blocks=1 + sum(blocks_for(p + o, 8) for p, o in shapes),
                             token_budget=sum(p for p, _ in shapes), max_num_seqs=len(shapes))
    cost = COSTS[data.draw(st.integers(0, len(COSTS) - 1))]
    full = simulate(requests, config, cost)
    gone = data.draw(st.sampled_from(requests))
    fewer = simulate([r for r in requests if r is not gone], replace(config), cost)
    for r in requests:
        if r is gone:
            continue
        before, after = full.outcomes[r.request_id], fewer.outcomes[r.request_id]
        assert before.first_token_ts is not None and after.first_token_ts is not None
        assert before.finish_ts is not None and after.finish_ts is not None
        assert after.first_token_ts <= before.first_token_ts + 1e-12
        assert after.finish_ts <= before.finish_ts + 1e-12


@settings(max_examples=500, deadline=None)
@given(st.integers(1, 64), st.lists(st.tuples(st.sampled_from(["alloc", "free", "hit"]), st.integers(0, 9),
                                              st.integers(0, 64)), max_size=80))
def test_free_queue_stays_consistent_and_bounded(blocks: int, ops: list[tuple[str, int, int]]) -> None:
    q = FreeBlockQueue(blocks)
    held: dict[int, int] = {}  # owner -> blocks it holds
    for op, owner, n in ops:
        if op == "alloc":
            take = min(n, q.free)
            q.allocate(take)
            held[owner] = held.get(owner, 0) + take
        elif op == "free" and held.get(owner):
            q.release(owner, held[owner], full_blocks=min(n, held[owner]))
            held[owner] = 0
        elif op == "hit" and not held.get(owner):
            got = q.take_cached(owner, n)
            assert 0 <= got <= n
            held[owner] = got
        assert q.free == blocks - sum(held.values())
        assert 0 <= q.free <= blocks and len(q) <= blocks + 1
