"""Runs of identical decode steps, taken in one go by the scheduler re-simulation (`scheduler_sim`).

Under load most simulated steps are alike: every running request decodes one token, nobody is admitted,
preempted or finishes, and the only pool change is new blocks off the front of the free queue. Stepping them one
by one through `sim_step.schedule_step` costs objects per member per step; here a stretch of them costs one
price per step (the same call on the same features, times summed in the same order, so every time is the same
float) and one bulk update per request. Whatever breaks the pattern (an arrival due, a finish, a preemption,
an admission that may fit, a prefix block to register) is left to `schedule_step`, step by step.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass

from attrib_agent.attribution.block_pool import FreeBlockQueue
from attrib_agent.attribution.sim_step import LiveRequest, blocks_for, finish
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.attribution.sim_types import SchedulerConfig


@dataclass(slots=True)
class Stretch:
    """What a stretch did: its steps' end times (one per step), the engine clock after them, and the requests
    its last step finished."""

    ends: list[float]
    now: float
    model_free: float
    finished: list[LiveRequest]
    least_free: int  # free blocks after its allocations, before the last step's finishes gave some back


def decode_stretch(running: list[LiveRequest], waiting: deque[LiveRequest], pool: FreeBlockQueue,
                   config: SchedulerConfig, pricer: Pricer, now: float, model_free: float,
                   next_arrival: float | None, max_steps: int,
                   observe: Callable[[int, float, float, float], None] | None = None) -> Stretch | None:
    """Run the coming alike decode steps of a synchronous engine at once (None: the next step is not one of them).
    A step is alike when every running request decodes (its KV one token behind, a token already out), the
    budget covers them all, their new blocks fit in the free ones, no prefix block gets cached, and the queue's
    head cannot be admitted (no budget or seat left, or its whole sequence does not fit now: it fits even less
    as the free blocks shrink). The stretch ends with the step whose end reaches the next arrival (the queue
    takes it before the following step), or with the first that finishes a request (delivered as the step loop
    delivers it: the membership changes after it). `observe(j, begin, end, seconds)` sees step j (0-based) before any
    request is updated: a member's KV then holds its `computed + j` tokens."""
    n = len(running)
    if not n or n > config.token_budget or max_steps < 1:
        return None
    bs = config.block_size
    if waiting and n < config.token_budget and n < config.max_num_seqs and _head_fits(waiting[0], pool, config):
        return None
    caching = config.prefix_caching
    most = max_steps
    context = 0
    for r in running:
        computed, outputs = r.computed, r.outputs
        if (r.pending or r.in_flight or outputs < 1 or r.first_token_ts is None
                or computed + 1 != r.req.prompt_tokens + outputs):
            return None
        left = r.target - outputs  # steps up to the one that finishes it
        if caching and r.req.prefix_group is not None:
            shared = len(r.shared)
            if shared < r.req.prefix_tokens // bs:  # a prefix block is cached once the tokens reach it
                left = min(left, (shared + 1) * bs - 1 - computed)
        if left < most:
            most = left
        context += computed + 1
    k = fitting_steps(running, pool.free, bs, most)
    if k <= 0:
        return None
    price = pricer.price4
    ends: list[float] = []
    for j in range(k):  # as the step loop: same features, same sums in the same order
        begin = now if now >= model_free else model_free
        seconds = price(0, n, context + j * n, 0)
        end = model_free = begin + seconds
        ends.append(end)
        if observe is not None:
            observe(j, begin, end, seconds)
        if end > now:
            now = end
        if next_arrival is not None and next_arrival <= now:
            break
    done = advance(running, ends, bs, pool)
    least_free = pool.free
    for r in done:  # after every allocation, in member order, as the last step's delivery
        finish(r, ends[-1], running, waiting, pool, bs)
    return Stretch(ends, now, model_free, done, least_free)


def _head_fits(head: LiveRequest, pool: FreeBlockQueue, config: SchedulerConfig) -> bool:
    """Whether admission could take the queue's head now (`schedule_step`'s whole-sequence check)."""
    if head.in_flight:
        return True  # skipped by admission: let the step-by-step path look behind it
    bs = config.block_size
    group = head.req.prefix_group
    prefix = head.req.prefix_tokens // bs if config.prefix_caching and group is not None else 0
    limit = (head.num_tokens - 1) // bs
    shared = pool.shared_hit(group, min(prefix, limit)) if prefix and group is not None else []
    return blocks_for(head.num_tokens, bs) - len(shared) + sum(b.ref == 0 for b in shared) <= pool.free


def fitting_steps(running: list[LiveRequest], free: int, bs: int, most: int) -> int:
    """The most decode steps (up to `most`) whose new blocks all fit in the `free` ones: no preemption within
    them, and a queue head that does not fit now fits even less later (the re-simulation and the forecast).
    Read off the steps at which the requests need a new block (each every `bs` steps from its first): with the
    blocks short already taken off `free`, the (free + 1)-th of those steps is the first that does not fit."""
    if most <= 0:
        return max(most, 0)
    left = free
    firsts: list[int] = []  # per request, the first step (1-based) past the blocks it holds
    need = 0  # the new blocks `most` steps take
    for r in running:
        computed, blocks = r.computed, r.blocks
        have = -(-computed // bs)  # blocks_for(computed): what its KV needs now
        if have > blocks:
            left -= have - blocks
            step = have * bs - computed + 1
        else:
            step = blocks * bs - computed + 1
        if step <= most:
            firsts.append(step)
            need += (most - step) // bs + 1
    if left < 0:
        return 0
    if need <= left:
        return most
    span = left * bs  # a request's first left + 1 block steps at most: only the left + 1 first of all count
    due = [k for step in firsts for k in range(step, min(most, step + span) + 1, bs)]
    due.sort()
    return due[left] - 1


def advance(running: list[LiveRequest], ends: list[float], bs: int, pool: FreeBlockQueue,
            steps: int | None = None) -> list[LiveRequest]:
    """Deliver a stretch of alike decode steps ending at `ends` to every running request (its tokens, times and
    new KV blocks); the requests it finished. The re-simulation and the forecast both take stretches this way.
    With `steps` instead of `ends`, the tokens count but their times are not kept (the forecast past its window,
    where only first tokens are read)."""
    if steps is None:
        steps = len(ends)
    total = 0
    done: list[LiveRequest] = []
    for r in running:
        grown = -(-(r.computed + steps) // bs)  # blocks_for, inlined
        if grown > r.blocks:
            total += grown - r.blocks
            r.blocks = grown
        r.computed += steps
        r.outputs += steps
        if ends:
            r.token_ts.extend(ends)
        if r.outputs >= r.target:
            done.append(r)
    if total:  # one allocation for all: every block comes off the front of the free queue, in any order
        pool.allocate(total)
    return done
