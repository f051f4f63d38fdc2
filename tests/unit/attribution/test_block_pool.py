"""The block pool's shared prefix blocks: hit, touch, LRU eviction from the free queue, bounded entries."""

from __future__ import annotations

from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest


def test_a_finished_requests_prefix_stays_cached_until_allocation_reaches_it() -> None:
    pool = FreeBlockQueue(10)
    pool.allocate(4)
    blocks = [pool.register("g", i) for i in range(3)]  # 3 prefix blocks + 1 own block
    assert pool.shared_hit("g", 5) == blocks
    pool.release(None, 4, 3, blocks)
    assert pool.free == 10
    hit = pool.shared_hit("g", 3)
    assert hit == blocks and all(b.ref == 0 for b in hit)
    pool.allocate(7)  # the 6 never-used blocks and the own unhashed one: the prefix survives
    assert len(pool.shared_hit("g", 3)) == 3
    pool.allocate(1)  # then the prefix's last block goes first (freed tail first, head last)
    assert len(pool.shared_hit("g", 3)) == 2


def test_touching_a_free_prefix_block_takes_it_out_of_the_free_queue() -> None:
    pool = FreeBlockQueue(6)
    pool.allocate(2)
    blocks = [pool.register("g", i) for i in range(2)]
    pool.release(None, 2, 2, blocks)
    pool.touch(pool.shared_hit("g", 2))
    assert pool.free == 4 and all(b.ref == 1 for b in blocks)
    pool.allocate(4)  # only the never-used blocks were left: the touched ones are not evicted
    assert pool.shared_hit("g", 2) == blocks


def test_free_queue_entries_stay_bounded_by_the_pool_under_touch_and_release_cycles() -> None:
    pool = FreeBlockQueue(200)
    pool.allocate(50)
    blocks = [pool.register("g", i) for i in range(50)]
    pool.release(None, 50, 50, blocks)
    for _ in range(100):
        hit = pool.shared_hit("g", 50)
        pool.touch(hit)
        pool.release(None, 50, 50, hit)
    assert len(pool) <= 2 * 200 and pool.free == 200


def test_shared_prefix_is_computed_once_and_admission_counts_only_uncached_blocks() -> None:
    """Two requests sharing a 512-token prefix: the second computes only its own 88 tokens; in a pool too small
    for two full copies it is still admitted, since its prefix blocks are held by the first."""
    cfg = SchedulerConfig(block_size=16, num_blocks=1 + 38 + 6, token_budget=2048)
    reqs = [SimRequest("a", 0.0, 600, 4, "sys", 512), SimRequest("b", 0.01, 600, 4, "sys", 512)]
    steps: list[dict[str, int]] = []
    simulate(reqs, cfg, _Flat(), on_step=lambda plan, *_: steps.append({m.request_id: m.tokens
                                                                         for m in plan.members}))
    assert {"a": 600} in steps and any(s.get("b") == 88 for s in steps)
    shared = simulate(reqs, cfg, _Flat()).outcomes
    unshared = simulate([reqs[0], SimRequest("b", 0.01, 600, 4)], cfg, _Flat()).outcomes
    assert shared["b"].first_token_ts is not None and unshared["a"].finish_ts is not None
    assert unshared["b"].scheduled_ts is not None and unshared["b"].scheduled_ts >= unshared["a"].finish_ts
    assert shared["b"].first_token_ts < unshared["a"].finish_ts


class _Flat:
    def step_seconds(self, context_tokens: int, decode_requests: int, decode_context_sum: int) -> float:
        return 0.01 + context_tokens * 1e-5
