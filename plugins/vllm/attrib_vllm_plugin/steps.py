"""One engine step as a message: read from vLLM's scheduler right after `Scheduler.schedule()` returned.

Everything here reads attributes (no vLLM import), so it is unit-tested with stand-ins and keeps working
where a field moved: a missing attribute raises, and the hook then disables the plugin with one log line.
Ids are vLLM's internal request ids (`<external id>-<8 hex>`); `external_id` undoes the suffix.
"""

from __future__ import annotations

import re
import time
from typing import Any

FORMAT_VERSION = 1
_INTERNAL_SUFFIX = re.compile(r"-[0-9a-f]{8}$")

# Why the head of the waiting queue was not admitted this step, in the order vLLM's waiting loop checks.
PAUSED = "paused"  # the scheduler is paused (admits nothing)
PREEMPTION = "preemption"  # a request was preempted this step: vLLM admits nobody in such a step
MAX_SEQS = "max_seqs"  # running requests reached max_num_seqs
TOKEN_BUDGET = "token_budget"  # the step's token budget (max_num_batched_tokens) was used up
NO_FREE_BLOCKS = "no_free_blocks"  # its whole prompt does not fit in the free KV blocks
DEFERRED = "deferred"  # skipped for a transient reason (grammar, KV transfer, stale output, LoRA slots)
OTHER = "other"  # none of the above could be told from the state after the step


def external_id(internal: str) -> str:
    """The id vLLM's frontend logs and puts in spans (`Received request X`): the internal id minus `-<8 hex>`."""
    return _INTERNAL_SUFFIX.sub("", internal)


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def waiting_reason(*, paused: bool, preempted: bool, running: int, max_seqs: int, scheduled_tokens: int,
                   token_budget: int, need_blocks: int, free_blocks: int, deferred: bool) -> str:
    """The first of vLLM 0.32's admission checks that the head of the queue fails, judged after the step."""
    if paused:
        return PAUSED
    if preempted:
        return PREEMPTION
    if running >= max_seqs:
        return MAX_SEQS
    if scheduled_tokens >= token_budget:
        return TOKEN_BUDGET
    if need_blocks > free_blocks:
        return NO_FREE_BLOCKS
    if deferred:
        return DEFERRED
    return OTHER


class StepCounter:
    """Numbers steps the way vLLM's `Iteration(N)` log line does: only steps that scheduled tokens count."""

    def __init__(self) -> None:
        self.next_iteration = 0

    def take(self, total_tokens: int) -> int | None:
        if total_tokens <= 0:
            return None
        i = self.next_iteration
        self.next_iteration += 1
        return i


def blocks_held(kv_cache_manager: Any) -> dict[str, int]:
    """Blocks in each request's block table (first KV cache group; a block shared by a prefix counts for each)."""
    manager = kv_cache_manager.coordinator.single_type_managers[0]
    return {rid: len(blocks) for rid, blocks in manager.req_to_blocks.items() if blocks}


def _head(sched: Any) -> Any | None:
    for queue in (getattr(sched, "kv_holding_waiting", None), sched.waiting):
        if queue:
            return queue.peek_request()
    return None


def head_record(sched: Any, out: Any, free_blocks: int) -> dict[str, Any] | None:
    """The first waiting request and why it is still waiting (None when nobody waits)."""
    head = _head(sched)
    if head is None:
        return None
    need = cdiv(head.num_tokens, sched.block_size)
    from_pause = getattr(sched, "_pause_state", None)
    reason = waiting_reason(
        paused=from_pause is not None and getattr(from_pause, "name", "UNPAUSED") != "UNPAUSED",
        preempted=bool(out.preempted_req_ids), running=len(sched.running), max_seqs=sched.max_num_running_reqs,
        scheduled_tokens=out.total_num_scheduled_tokens, token_budget=sched.max_num_scheduled_tokens,
        need_blocks=need, free_blocks=free_blocks, deferred=head in getattr(sched, "deferred_waiting", ()),
    )
    return {"id": head.request_id, "reason": reason, "tokens": head.num_tokens, "need_blocks": need,
            "preemptions": head.num_preemptions}


def step_record(sched: Any, out: Any, iteration: int | None, drops: int, now: float | None = None) -> dict[str, Any]:
    """The message for one `schedule()` call; `out` is the SchedulerOutput it returned."""
    kv = sched.kv_cache_manager
    pool = kv.block_pool
    free = pool.get_num_free_blocks()
    hits = {r.req_id: r.num_computed_tokens for r in out.scheduled_new_reqs}
    cached = out.scheduled_cached_reqs
    resumed = set(getattr(cached, "resumed_req_ids", ()) or ())
    for rid, done in zip(cached.req_ids, cached.num_computed_tokens, strict=False):
        if rid in resumed:
            hits[rid] = done
    scheduled = []
    for rid, n in out.num_scheduled_tokens.items():
        req = sched.requests.get(rid)
        done_after = req.num_computed_tokens if req is not None else None
        entry: dict[str, Any] = {"id": rid, "new": n, "done": None if done_after is None else done_after - n}
        if rid in hits:
            entry["hit"] = hits[rid]  # prefix-cache (and connector) tokens found at admission
        scheduled.append(entry)
    admitted = [r.req_id for r in out.scheduled_new_reqs if r.req_id not in resumed]
    readmitted = sorted(resumed | {rid for rid in admitted if _preempted_before(sched, rid)})
    return {
        "v": FORMAT_VERSION, "kind": "step", "t": time.time() if now is None else now,
        "step": sched.current_step, "iter": iteration, "tokens": out.total_num_scheduled_tokens,
        "scheduled": scheduled,
        "admitted": [rid for rid in admitted if rid not in readmitted], "resumed": readmitted,
        "preempted": sorted(out.preempted_req_ids or ()), "finished": sorted(out.finished_req_ids),
        "running": len(sched.running), "waiting": len(sched.waiting) + len(getattr(sched, "kv_holding_waiting", ())),
        "blocks": blocks_held(kv), "free_blocks": free, "total_blocks": pool.num_gpu_blocks,
        "head": head_record(sched, out, free), "drops": drops,
    }


def _preempted_before(sched: Any, rid: str) -> bool:
    req = sched.requests.get(rid)
    return req is not None and req.num_preemptions > 0


def hello_record(sched: Any, now: float | None = None) -> dict[str, Any]:
    """Sent once per scheduler: the geometry and limits that every step message is judged against."""
    return {
        "v": FORMAT_VERSION, "kind": "hello", "t": time.time() if now is None else now,
        "block_size": sched.block_size, "total_blocks": sched.kv_cache_manager.block_pool.num_gpu_blocks,
        "max_num_seqs": sched.max_num_running_reqs, "token_budget": sched.max_num_scheduled_tokens,
        "scheduler": type(sched).__name__,
    }
