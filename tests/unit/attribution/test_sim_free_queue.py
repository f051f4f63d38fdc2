"""The re-simulation's free-block queue frees as vLLM 0.32's `BlockPool.free_blocks` does."""

from __future__ import annotations

from attrib_agent.attribution.block_pool import FreeBlockQueue


def test_unhashed_blocks_are_reused_before_a_preempted_requests_cached_prefix() -> None:
    pool = FreeBlockQueue(10)
    pool.allocate(10)
    pool.release(7, 4, full_blocks=3)  # preempted: 3 full (hashed) blocks and a partial tail
    pool.release(None, 3, full_blocks=2)  # finished: 2 hashed blocks to the back, its partial tail to the front
    pool.allocate(2)  # takes the two partial tails first
    assert pool.take_cached(7, 3) == 3


def test_with_prefix_caching_off_nothing_is_kept() -> None:
    pool = FreeBlockQueue(6, prefix_caching=False)
    pool.allocate(6)
    pool.release(1, 6, full_blocks=6)
    assert pool.take_cached(1, 6) == 0 and pool.free == 6


def test_hashed_blocks_of_finished_requests_queue_behind_a_cached_prefix() -> None:
    pool = FreeBlockQueue(8)
    pool.allocate(8)
    pool.release(3, 4, full_blocks=4)
    pool.release(None, 4, full_blocks=4)  # behind request 3's prefix: evicted after it
    pool.allocate(3)
    assert pool.take_cached(3, 4) == 1
