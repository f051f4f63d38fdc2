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

from attrib_agent.attribution.sim_trace import Blame, Member
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest

_NO_OWNER = -1


class FreeBlockQueue:
    """vLLM's free-block queue: freed blocks join the back, allocation takes from the front (evicting whatever
    prefix-cache content those blocks held). Run-length encoded: [owner, count] segments, at most one per free
    block, so it stays bounded by the pool size."""

    def __init__(self, blocks: int, prefix_caching: bool = True) -> None:
        self.free = blocks
        self._caching = prefix_caching
        self._segments: deque[list[int]] = deque([[_NO_OWNER, blocks]] if blocks > 0 else [])
        self._cached: dict[int, list[int]] = {}  # owner -> its segment of still-cached prefix blocks

    def __len__(self) -> int:
        return len(self._segments)

    def allocate(self, n: int) -> None:
        if n > self.free:
            raise ValueError(f"allocating {n} blocks with {self.free} free")
        self.free -= n
        while n > 0 or (self._segments and self._segments[0][1] == 0):
            seg = self._segments[0]
            take = min(n, seg[1])
            seg[1] -= take  # a cached segment loses its highest block index first (vLLM frees tail-first)
            n -= take
            if seg[1] == 0:
                self._segments.popleft()
                if seg[0] != _NO_OWNER and self._cached.get(seg[0]) is seg:
                    del self._cached[seg[0]]

    def release(self, owner: int | None, blocks: int, full_blocks: int = 0) -> None:
        """Free `blocks`, of which the first `full_blocks` are full (hashed). As vLLM's `BlockPool.free_blocks`:
        hashed blocks join the back (LRU; reusable by `owner` if given, else by nobody), the others the front
        (reused first); with prefix caching off nothing is hashed."""
        if blocks <= 0:
            return
        self.free += blocks
        hashed = min(full_blocks, blocks) if self._caching else 0
        if blocks > hashed:
            first = self._segments[0] if self._segments else None
            if first is not None and first[0] == _NO_OWNER:
                first[1] += blocks - hashed
            else:
                self._segments.appendleft([_NO_OWNER, blocks - hashed])
        if hashed and owner is not None:
            self.forget(owner)
            seg = [owner, hashed]
            self._segments.append(seg)
            self._cached[owner] = seg
        elif hashed:
            last = self._segments[-1] if self._segments else None
            if last is not None and last[0] == _NO_OWNER:
                last[1] += hashed
            else:
                self._segments.append([_NO_OWNER, hashed])

    def take_cached(self, owner: int, max_blocks: int) -> int:
        """Re-use the owner's cached prefix (at most `max_blocks`); returns how many blocks it got back."""
        seg = self._cached.pop(owner, None)
        if seg is None:
            return 0
        hit = min(seg[1], max(max_blocks, 0))
        self.free -= hit
        seg[1] -= hit
        seg[0] = _NO_OWNER  # the rest lies beyond the hit: nobody will find it again
        if seg[1] == 0:
            self._drop(seg)
        return hit

    def forget(self, owner: int) -> None:
        seg = self._cached.pop(owner, None)
        if seg is not None:
            seg[0] = _NO_OWNER

    def _drop(self, seg: list[int]) -> None:
        for i, s in enumerate(self._segments):
            if s is seg:
                del self._segments[i]
                return


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


def _preempt(victim: LiveRequest, pool: FreeBlockQueue, block_size: int) -> None:
    pool.release(victim.index, victim.blocks, victim.computed // block_size)
    victim.redo_until = max(victim.redo_until, victim.computed)
    victim.computed = 0
    victim.blocks = 0
    victim.preemptions += 1


def schedule_step(running: list[LiveRequest], waiting: deque[LiveRequest], pool: FreeBlockQueue,
                  config: SchedulerConfig, now: float) -> StepPlan:
    """Schedule one step, mutating the queues, the pool and the requests' block counts (not their tokens)."""
    bs = config.block_size
    budget = config.token_budget
    members: list[Member] = []
    preempted: list[LiveRequest] = []
    admitted: list[LiveRequest] = []
    i = 0
    while i < len(running) and budget > 0:
        req = running[i]
        if req.pending and req.computed + 2 - req.pending >= req.req.prompt_tokens + req.target:
            i += 1  # async: the token in flight is its last, no step more (vLLM's max_tokens check)
            continue
        n = min(req.num_tokens - req.computed, budget)
        need = blocks_for(req.computed + n, bs) - req.blocks
        victim = None
        while need > pool.free and victim is not req:
            victim = running.pop()
            victim.forced_by = ((req.req.request_id, 1.0),) if victim is not req else holders(running)
            _preempt(victim, pool, bs)
            preempted.append(victim)
            waiting.appendleft(victim)
        if victim is req:
            break
        if need > 0:
            pool.allocate(need)
            req.blocks += need
        members.append(_member(req, n))
        budget -= n
        i += 1
    if preempted:
        return StepPlan(members, preempted, "preemption")
    while True:
        if not waiting:
            return StepPlan(members, preempted, "empty", admitted=admitted)
        if budget <= 0:
            return StepPlan(members, preempted, "budget", admitted=admitted)
        if len(running) >= config.max_num_seqs:
            return StepPlan(members, preempted, "seats", admitted=admitted)
        skip = 0  # async: a preempted request waits until its step in flight is back (vLLM skips it)
        while skip < len(waiting) and waiting[skip].in_flight:
            skip += 1
        if skip == len(waiting):
            return StepPlan(members, preempted, "empty", admitted=admitted)
        req = waiting[skip]
        if blocks_for(req.num_tokens, bs) > pool.free:
            return StepPlan(members, preempted, "kv", req, admitted)
        hit = pool.take_cached(req.index, (req.num_tokens - 1) // bs)
        req.computed, req.blocks = hit * bs, hit
        n = min(req.num_tokens - req.computed, budget)
        need = blocks_for(req.computed + n, bs) - req.blocks
        pool.allocate(need)
        req.blocks += need
        del waiting[skip]
        running.append(req)
        admitted.append(req)
        if req.scheduled_ts is None:
            req.scheduled_ts = now
        members.append(_member(req, n))
        budget -= n


def _member(req: LiveRequest, tokens: int) -> Member:
    decode = tokens == 1 and req.outputs + req.pending >= 1 and req.computed + 1 == req.num_tokens
    return Member(req.req.request_id, tokens, req.computed, decode, req.redo_until)
