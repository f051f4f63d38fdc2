"""The small decisions the step inference makes when the logged counts and the known requests disagree.

Who was preempted (vLLM's rule: the most recently admitted running request, while an allocation does not
fit), who finished without anyone having said so yet (the request whose freed blocks best explain the
line's KV usage), and how a count's remainder is shared among requests whose prompts are not known yet.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.sched_state import Geometry, Track, blocks_for


@dataclass(eq=False, slots=True)
class Slot:
    """One request's candidate part in the step being inferred (identity matters, not value)."""

    track: Track
    phase: str  # "prefill" | "decode" | "recompute"
    tokens: int | None  # None until the counts decide
    admitted: bool = False  # taken from the waiting queue in this step
    dropped: bool = False  # did not run: preempted or finished before the step
    hit: int = 0  # prompt tokens found in the prefix cache when it was scheduled (not computed, not counted)


def kv_victims(slots: list[Slot], observed_used: float | None, geo: Geometry, budget: int) -> list[Slot]:
    """Replay vLLM's allocation over the running requests in order; return who it would preempt (tail first).

    A request whose chunk is unknown is checked with the budget as its chunk only when it is last: the
    earlier ones cannot be sized without the counts, so they are skipped.
    """
    usable, bs = geo.usable_blocks, geo.block_size
    if usable is None or bs is None or observed_used is None:
        return []
    free = usable - observed_used
    victims: list[Slot] = []
    for s in slots:
        if any(s is v for v in victims):
            break
        tokens = s.tokens if s.tokens is not None else (budget if s is slots[-1] else None)
        if tokens is None:
            continue
        need = blocks_for(s.track.computed + tokens, bs) - blocks_for(s.track.computed, bs)
        while need > free:
            tail = next((c for c in reversed(slots) if not any(c is v for v in victims)), None)
            if tail is None:
                break
            victims.append(tail)
            free += blocks_for(tail.track.computed, bs)
            if tail is s:
                break
        if any(s is v for v in victims):
            break
        free -= need
    return victims


def pool_tight(slots: list[Slot], observed_used: float | None, geo: Geometry, budget: int) -> bool:
    """Whether this step's allocations could have exceeded the free blocks, the only trigger of a preemption.

    Each decode needs at most one new block and a chunk at most its tokens' worth plus one; when the
    blocks free after the previous step cover that, nobody can have been preempted.
    """
    usable, bs = geo.usable_blocks, geo.block_size
    if usable is None or bs is None or observed_used is None:
        return False
    most = 0
    for s in slots:
        tokens = s.tokens if s.tokens is not None else budget
        most += 1 if s.phase == "decode" else blocks_for(tokens, bs) + 1
    return usable - observed_used < most


def pick_unreported_finishes(candidates: list[Slot], n: int, book: LifecycleBook, geo: Geometry,
                             kv_usage: float) -> list[Slot]:
    """The `n` decoding requests most likely to have finished unseen (their span has not landed).

    With KV geometry, each pick is the request whose freed blocks bring the predicted usage closest to the
    line's; ties (and no geometry) go to the request that has generated the most.
    """
    pool = [s for s in candidates if not ((lc := book.get(s.track.rid)) is not None and lc.complete)]
    usable, bs = geo.usable_blocks, geo.block_size
    if usable is None or bs is None:
        pool.sort(key=lambda s: (-s.track.outputs, s.track.order))
        return pool[:n]
    size = bs
    observed = kv_usage * usable
    after = sum(blocks_for(s.track.computed + (s.tokens or 0), size) for s in candidates)
    chosen: list[Slot] = []
    for _ in range(min(n, len(pool))):
        best = min(pool, key=lambda s: (abs(after - blocks_for(s.track.computed + 1, size) - observed),
                                        -s.track.outputs, s.track.order))
        after -= blocks_for(best.track.computed + 1, size)
        pool.remove(best)
        chosen.append(best)
    return chosen


def split_context(total: int, unknown: list[Slot], misfit: Callable[[list[int]], float] | None = None,
                  block_size: int | None = None) -> list[int]:
    """Share a step's unexplained context tokens among prefills of unknown size, in scheduling order.

    When some requests continue a prompt (long ones, chunked) and others start one in the same step, the
    new ones get `x` tokens each and the continuing ones the rest. With KV geometry, `x` is the value (tried
    wherever some request's block count changes) whose predicted blocks best match the line's KV usage
    (`misfit`), ties going to the smallest `x` (the continuing prompt, known to be long, keeps the rest); a
    landed span corrects a wrong guess. Without geometry, or with only one kind, shares are equal.
    """
    fresh = [s.admitted and s.track.computed == 0 and not s.track.resuming for s in unknown]
    n_new = sum(fresh)
    n_old = len(unknown) - n_new
    equal = split_unknown(total, len(unknown))
    if misfit is None or block_size is None or n_new == 0 or n_old == 0 or total - n_old < n_new:
        return equal
    cap = (total - n_old) // n_new

    def shares(x: int) -> list[int]:
        old_parts = iter(split_unknown(total - x * n_new, n_old))
        return [x if f else next(old_parts) for f in fresh]

    bs = block_size
    xs = {x for k in range(cap // bs + 1) for x in (k * bs, k * bs + 1)}  # where a new request's blocks change
    for u, f in zip(unknown, fresh, strict=True):  # where a continuing request's blocks change
        if not f:
            lo, hi = u.track.computed + (total - cap * n_new) // n_old, u.track.computed + total // n_old
            for m in range(lo // bs, hi // bs + 2):
                x = (total - n_old * (m * bs - u.track.computed)) // n_new
                xs |= {x, x + 1}
    xs = {x for x in xs | {cap, total // len(unknown)} if 1 <= x <= cap}
    return shares(min(sorted(xs), key=lambda x: (misfit(shares(x)), x)))


def split_unknown(total: int, n: int) -> list[int]:
    """Share `total` tokens among `n` requests of unknown size: equal parts, the remainder to the earliest."""
    if n <= 0:
        return []
    total = max(total, 0)
    base, rem = divmod(total, n)
    return [base + (1 if i < rem else 0) for i in range(n)]
