"""One scheduling step of vLLM 0.32's v1 scheduler (`vllm/v1/core/sched/scheduler.py`), over plain state.

Running requests first, in admission order: a prefill chunk up to the remaining token budget, or one decode
token; KV blocks are allocated as they grow; when the pool is short the most recently admitted running request
is preempted (blocks freed, recomputed from scratch, back to the front of the queue), possibly the request
itself. Then, only if nobody was preempted, waiting requests FCFS: each admitted only if its whole sequence fits
in the free blocks (`scheduler_reserve_full_isl`), stopping at the first that does not (head-of-line). The free
queue keeps vLLM's LRU order and prefix cache: a preempted request's full blocks stay reusable until allocation
reaches them, so its recompute is often nearly free, as in vLLM.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from attrib_agent.attribution.block_pool import FreeBlockQueue, SharedBlock
from attrib_agent.attribution.sim_trace import Blame, Member
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest


@dataclass(slots=True, eq=False)
class LiveRequest:
    """A request's scheduling state during a simulation."""

    req: SimRequest
    index: int
    target: int  # output tokens to produce (at least 1)
    computed: int = 0
    outputs: int = 0
    pending: int = 0  # sampled tokens not yet back (async scheduling's output placeholders)
    in_flight: int = 0  # scheduled steps whose output is not back yet
    blocks: int = 0
    preemptions: int = 0
    redo_until: int = 0  # tokens computed before the last preemption: recomputing them is the preemption's cost
    forced_by: Blame = ()
    refused: bool = False  # its whole sequence cannot fit in the pool: vLLM would not take it
    queued_ts: float | None = None
    scheduled_ts: float | None = None
    first_token_ts: float | None = None
    finish_ts: float | None = None
    token_ts: list[float] = field(default_factory=list)
    shared: list[SharedBlock] = field(default_factory=list)  # its group prefix's cached blocks, in order

    @property
    def num_tokens(self) -> int:
        return self.req.prompt_tokens + self.outputs + self.pending


@dataclass(slots=True)
class StepPlan:
    """What one step scheduled, whom it preempted and why admission stopped."""

    members: list[Member]
    preempted: list[LiveRequest]
    stop: str  # why admission stopped: "empty" | "budget" | "kv" | "seats" | "preemption"
    blocked: LiveRequest | None = None  # the waiting request that did not fit
    admitted: list[LiveRequest] = field(default_factory=list)  # moved from waiting to running this step


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks that hold `tokens` tokens."""
    return -(-tokens // block_size)


def holders(running: Sequence[LiveRequest], exclude: LiveRequest | None = None) -> Blame:
    """Each running request's share of the blocks held: whom a full pool blames."""
    total = sum(r.blocks for r in running if r is not exclude)
    if total <= 0:
        return ()
    return tuple((r.req.request_id, r.blocks / total) for r in running if r is not exclude and r.blocks > 0)


def finish(lv: LiveRequest, end: float, running: list[LiveRequest], waiting: deque[LiveRequest],
           pool: FreeBlockQueue, block_size: int) -> None:
    """Its last token is back: off the engine, its blocks freed (the full ones hashed, at the back of the free
    queue)."""
    lv.finish_ts = end
    if lv in running:
        running.remove(lv)
    elif lv in waiting:
        waiting.remove(lv)
    pool.release(None, lv.blocks, lv.computed // block_size, lv.shared)
    lv.blocks, lv.shared = 0, []


def _preempt(victim: LiveRequest, pool: FreeBlockQueue, block_size: int) -> None:
    pool.release(victim.index, victim.blocks, victim.computed // block_size, victim.shared)
    victim.shared = []
    victim.redo_until = max(victim.redo_until, victim.computed)
    victim.computed = 0
    victim.blocks = 0
    victim.preemptions += 1


def schedule_step(running: list[LiveRequest], waiting: deque[LiveRequest], pool: FreeBlockQueue,
                  config: SchedulerConfig, now: float) -> StepPlan:
    """Schedule one step, mutating the queues, the pool and the requests' block counts (not their tokens)."""
    bs = config.block_size
    budget = config.token_budget
    caching = config.prefix_caching
    members: list[Member] = []
    preempted: list[LiveRequest] = []
    admitted: list[LiveRequest] = []
    i = 0
    while i < len(running) and budget > 0:
        req = running[i]
        r = req.req
        computed, pending, outputs = req.computed, req.pending, req.outputs
        total = r.prompt_tokens + outputs + pending  # num_tokens, inlined: this loop runs per member per step
        if pending and computed + 2 - pending >= r.prompt_tokens + req.target:
            i += 1  # async: the token in flight is its last, no step more (vLLM's max_tokens check)
            continue
        n = total - computed
        if n > budget:
            n = budget
        need = -(-(computed + n) // bs) - req.blocks
        if need > pool.free and not _make_room(req, need, running, waiting, pool, bs, preempted):
            break
        if need > 0:
            pool.allocate(need)
            req.blocks += need
        if caching and r.prefix_group is not None and len(req.shared) < r.prefix_tokens // bs:
            _cache_blocks(req, computed + n, pool, config)
        members.append(Member(r.request_id, n, computed,
                              n == 1 and outputs + pending >= 1 and computed + 1 == total, req.redo_until))
        budget -= n
        i += 1
    if preempted:
        return StepPlan(members, preempted, "preemption")
    scheduled: list[tuple[LiveRequest, int]] = []
    stop, blocked = admit(running, waiting, pool, config, budget, now, scheduled)
    for req, n in scheduled:  # nothing changed their tokens since: as if made at admission
        admitted.append(req)
        members.append(_member(req, n))
    return StepPlan(members, preempted, stop, blocked, admitted)


def admit(running: list[LiveRequest], waiting: deque[LiveRequest], pool: FreeBlockQueue, config: SchedulerConfig,
          budget: int, now: float, out: list[tuple[LiveRequest, int]]) -> tuple[str, LiveRequest | None]:
    """Admission after the running requests were scheduled, with the `budget` they left: waiting requests FCFS,
    moved to `running` and appended to `out` with the tokens scheduled, until one does not fit. Returns why it
    stopped and the request that did not fit."""
    bs = config.block_size
    while True:
        if not waiting:
            return "empty", None
        if budget <= 0:
            return "budget", None
        if len(running) >= config.max_num_seqs:
            return "seats", None
        skip = 0  # async: a preempted request waits until its step in flight is back (vLLM skips it)
        while skip < len(waiting) and waiting[skip].in_flight:
            skip += 1
        if skip == len(waiting):
            return "empty", None
        req = waiting[skip]
        tokens = req.req.prompt_tokens + req.outputs + req.pending  # num_tokens, inlined (as blocks_for below)
        group = req.req.prefix_group
        if group is None or not config.prefix_caching:  # (the check below runs at every step someone waits)
            if -(-tokens // bs) > pool.free:  # scheduler_reserve_full_isl: the whole sequence must fit
                return "kv", req
            shared: list[SharedBlock] = []
            own = pool.peek_cached(req.index, (tokens - 1) // bs)
        else:
            limit = (tokens - 1) // bs  # vLLM recomputes the last token: at most this many blocks hit
            prefix = _prefix_blocks(req, config)
            shared = pool.shared_hit(group, min(prefix, limit)) if prefix else []
            own = pool.peek_cached(req.index, limit - len(shared)) if len(shared) == prefix else 0
            # the whole sequence must fit; hit blocks that sit free still count
            if blocks_for(tokens, bs) - len(shared) + sum(b.ref == 0 for b in shared) > pool.free:
                return "kv", req
            pool.touch(shared)
        hit = len(shared) + (pool.take_cached(req.index, own) if own else 0)
        req.shared, req.computed, req.blocks = shared, hit * bs, hit
        n = min(tokens - req.computed, budget)
        need = -(-(req.computed + n) // bs) - req.blocks  # blocks_for, inlined
        pool.allocate(need)
        req.blocks += need
        if group is not None:  # (a request without a shared prefix caches none of its blocks at scheduling)
            _cache_blocks(req, req.computed + n, pool, config)
        del waiting[skip]
        running.append(req)
        if req.scheduled_ts is None:
            req.scheduled_ts = now
        out.append((req, n))
        budget -= n


def plan_sync(running: list[LiveRequest], waiting: deque[LiveRequest], pool: FreeBlockQueue,
              config: SchedulerConfig, now: float, out: list[tuple[LiveRequest, int]]
              ) -> tuple[int, str, LiveRequest | None, int, int, int, int, int]:
    """`schedule_step` for a synchronous engine (no token in flight between steps: the forecast), without
    `Member` objects: the members and their tokens are appended to `out`, and the step's price features are
    summed as `Pricer.features` sums them. Returns (requests preempted, why admission stopped, the request that
    did not fit, and the five features)."""
    bs = config.block_size
    budget = config.token_budget
    caching = config.prefix_caching
    preempted: list[LiveRequest] = []
    t = r = c = p = q = 0
    i = 0
    while i < len(running) and budget > 0:
        lv = running[i]
        req = lv.req
        computed = lv.computed
        total = req.prompt_tokens + lv.outputs
        n = total - computed
        if n > budget:
            n = budget
        need = -(-(computed + n) // bs) - lv.blocks
        if need > pool.free and not _make_room(lv, need, running, waiting, pool, bs, preempted):
            break
        if need > 0:
            pool.allocate(need)
            lv.blocks += need
        if caching and req.prefix_group is not None and len(lv.shared) < req.prefix_tokens // bs:
            _cache_blocks(lv, computed + n, pool, config)
        if n == 1 and lv.outputs >= 1 and computed + 1 == total:  # Member.decode
            r += 1
            c += total
        else:
            t += n
            p += n * computed + n * (n + 1) // 2
            q += 1
        out.append((lv, n))
        budget -= n
        i += 1
    if preempted:
        return len(preempted), "preemption", None, t, r, c, p, q
    first = len(out)
    stop, blocked = admit(running, waiting, pool, config, budget, now, out)
    for lv, n in out[first:]:
        computed = lv.computed
        if n == 1 and lv.outputs >= 1 and computed + 1 == lv.num_tokens:
            r += 1
            c += computed + 1
        else:
            t += n
            p += n * computed + n * (n + 1) // 2
            q += 1
    return 0, stop, blocked, t, r, c, p, q


def _make_room(req: LiveRequest, need: int, running: list[LiveRequest], waiting: deque[LiveRequest],
               pool: FreeBlockQueue, bs: int, preempted: list[LiveRequest]) -> bool:
    """Preempt the most recently admitted running requests until `req`'s `need` new blocks fit; False when
    `req` itself had to go."""
    victim = None
    while need > pool.free and victim is not req:
        victim = running.pop()
        victim.forced_by = ((req.req.request_id, 1.0),) if victim is not req else holders(running)
        _preempt(victim, pool, bs)
        preempted.append(victim)
        waiting.appendleft(victim)
    return victim is not req


def _prefix_blocks(req: LiveRequest, config: SchedulerConfig) -> int:
    """Blocks of the request's group prefix that other requests of the group can share (full ones only)."""
    if not config.prefix_caching or req.req.prefix_group is None:
        return 0
    return req.req.prefix_tokens // config.block_size


def _cache_blocks(req: LiveRequest, tokens: int, pool: FreeBlockQueue, config: SchedulerConfig) -> None:
    """vLLM's `cache_blocks` at scheduling: prefix blocks the scheduled tokens fill become cached at once."""
    full = min(_prefix_blocks(req, config), tokens // config.block_size)
    group = req.req.prefix_group
    while group is not None and len(req.shared) < full:
        req.shared.append(pool.register(group, len(req.shared)))


def _member(req: LiveRequest, tokens: int) -> Member:
    decode = tokens == 1 and req.outputs + req.pending >= 1 and req.computed + 1 == req.num_tokens
    return Member(req.req.request_id, tokens, req.computed, decode, req.redo_until)
