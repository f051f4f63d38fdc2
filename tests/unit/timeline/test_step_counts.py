"""The small decisions of the step inference: victims, unreported finishes, shares of a count."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.sched_state import Geometry, Track, blocks_for
from attrib_agent.timeline.step_counts import (
    Slot,
    kv_victims,
    pick_unreported_finishes,
    pool_tight,
    split_context,
    split_unknown,
)

GEO = Geometry(block_size=16, num_blocks=11)  # 10 usable blocks


def slot(rid: str, computed: int, phase: str = "decode", tokens: int | None = 1, outputs: int = 1,
         admitted: bool = False) -> Slot:
    return Slot(Track(rid, 0.0, 0, prompt=None, computed=computed, outputs=outputs), phase, tokens, admitted)


@settings(max_examples=500, deadline=None)
@given(st.integers(-5, 10_000), st.integers(0, 40))
def test_split_unknown_shares_the_whole_count(total: int, n: int) -> None:
    parts = split_unknown(total, n)
    assert len(parts) == n and all(p >= 0 for p in parts)
    if n:
        assert sum(parts) == max(total, 0) and max(parts) - min(parts) <= 1


@settings(max_examples=500, deadline=None)
@given(st.integers(2, 4096), st.lists(st.tuples(st.booleans(), st.integers(0, 3000)), min_size=1, max_size=6),
       st.sampled_from([None, 16]))
def test_split_context_shares_the_whole_count(total: int, who: list[tuple[bool, int]], bs: int | None) -> None:
    unknown = [slot(f"r{i}", 0 if fresh else done, "prefill", None, 0, admitted=fresh)
               for i, (fresh, done) in enumerate(who)]

    def misfit(shares: list[int]) -> float:
        return float(sum(blocks_for(u.track.computed + n, 16) for u, n in zip(unknown, shares, strict=True)) % 7)

    parts = split_context(total, unknown, misfit if bs else None, bs)
    assert len(parts) == len(unknown) and all(p >= 0 for p in parts)
    assert sum(parts) == total


def test_split_context_fits_the_kv_usage_when_a_newcomer_joins_a_long_prompt() -> None:
    """whale1's step 3: a 7600-token prompt's last 1456 tokens and four 32-token newcomers, 64 blocks used."""
    whale = slot("w", 6144, "prefill", None, 0)
    newcomers = [slot(f"s{i}", 0, "prefill", None, 0, admitted=True) for i in range(4)]
    unknown = [whale, *newcomers]

    def misfit(shares: list[int]) -> float:
        return abs(sum(blocks_for(u.track.computed + n, 128) for u, n in zip(unknown, shares, strict=True)) - 64)

    parts = split_context(1584, unknown, misfit, 128)
    assert misfit(parts) == 0 and parts[1:] == [parts[1]] * 4 and parts[1] <= 128


def test_the_victims_are_the_most_recently_admitted_while_blocks_are_short() -> None:
    slots = [slot("a", 32), slot("b", 47), slot("c", 15), slot("d", 16)]  # 2 + 3 + 1 + 1 = 7 blocks held
    assert pool_tight(slots, 10.0, GEO, 2048)
    assert [s.track.rid for s in kv_victims(slots, 10.0, GEO, 2048)] == ["d"]  # a's new block needs one freed
    assert kv_victims(slots, 7.0, GEO, 2048) == []
    assert not pool_tight(slots, 5.0, GEO, 2048)
    assert kv_victims(slots, 10.0, Geometry(), 2048) == [] and not pool_tight(slots, 10.0, Geometry(), 2048)


def test_the_victim_can_be_the_request_itself() -> None:
    slots = [slot("a", 16, "prefill", 100, 0)]
    assert [s.track.rid for s in kv_victims(slots, 10.0, GEO, 2048)] == ["a"]


def test_unreported_finishes_are_picked_by_the_blocks_they_free() -> None:
    slots = [slot("big", 100), slot("small", 10)]  # 7 and 1 blocks after their next token
    book = LifecycleBook()
    chosen = pick_unreported_finishes(slots, 1, book, GEO, kv_usage=0.1)  # 1 block left in use
    assert [s.track.rid for s in chosen] == ["big"]
    chosen = pick_unreported_finishes(slots, 1, book, GEO, kv_usage=0.7)
    assert [s.track.rid for s in chosen] == ["small"]
    slots[0].track.outputs = 50
    assert [s.track.rid for s in pick_unreported_finishes(slots, 1, book, Geometry(), 0.0)] == ["big"]


def test_every_allocation_that_does_not_fit_takes_one_more_victim() -> None:
    slots = [slot("a", 32), slot("b", 47), slot("c", 16), slot("d", 16)]  # c's next token needs a new block too
    assert [s.track.rid for s in kv_victims(slots, 10.0, GEO, 2048)] == ["d", "c"]
