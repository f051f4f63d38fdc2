"""`/v1/timeline`: what the page draws, in one bounded JSON document built from the pipeline's timeline.

Steps (with members by phase), the KV ledger per request as change points only (a request's blocks change
every block_size tokens, not every step): each request's exclusive blocks (`kv`) and the prefix blocks several
share, counted once (`kv_shared`; timeline/kv_share.py), which together are the ledger's blocks in use; request
lanes, the victims with their top culprits and the GPU's NVML readings. At most `max_steps` steps (and
`MAX_MEMBERS` step members) go out: with `since`, the oldest ones after it (page on with `next_since`); without,
the newest ones, which is what a live view wants. `window` keeps only the last that many seconds before the
newest step (not before "now": an idle engine keeps its last traffic in view).
Requests that never entered the engine (vLLM's `/tokenize` ids, rejections) get no lane: the timeline's book
holds only requests with an `Added request` line or a span (timeline/lifecycle.py).
"""

from __future__ import annotations

import bisect
import math
from typing import Any, Final

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_codec import culprit_to_dict
from attrib_agent.read_model import TimelineReads
from attrib_agent.sinks.api.top import BadQuery, parse_duration
from attrib_agent.timeline.gpu_samples import MAX_SAMPLE_AGE_S, bandwidth_ratio
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome

DEFAULT_MAX_STEPS: Final = 2000
MAX_STEPS: Final = 10_000
MAX_MEMBERS: Final = 100_000  # step members per response (~2.5 MB of JSON): a GPU batch holds hundreds
MAX_REQUESTS: Final = 2000  # lanes per response; the requests overlapping the steps sent, earliest first
CULPRITS_PER_VICTIM: Final = 3
PHASES: Final = ("prefill", "decode", "recompute")
MAX_GPU_SAMPLES: Final = 4096  # NVML readings per response (one a second per GPU: over an hour for one GPU)


def parse_ts(name: str, text: str | None) -> float | None:
    if text is None:
        return None
    try:
        ts = float(text)
    except ValueError:
        raise BadQuery(f"{name} must be a unix time in seconds") from None
    if not math.isfinite(ts) or ts < 0:
        raise BadQuery(f"{name} must be a finite unix time in seconds")
    return ts


def parse_window(text: str | None) -> float | None:
    """`?window=` as in /v1/culprits/top: `2m`, `90s` or plain seconds."""
    return None if text is None else parse_duration(text)


def parse_max_steps(text: str | None) -> int:
    if text is None:
        return DEFAULT_MAX_STEPS
    try:
        n = int(text)
    except ValueError:
        raise BadQuery(f"max_steps must be an integer from 1 to {MAX_STEPS}") from None
    if not 1 <= n <= MAX_STEPS:
        raise BadQuery(f"max_steps must be an integer from 1 to {MAX_STEPS}")
    return n


Step = tuple[StepInput, StepOutcome]


def timeline_json(view: TimelineReads, since: float | None, until: float | None, *,
                  max_steps: int = DEFAULT_MAX_STEPS, max_requests: int = MAX_REQUESTS,
                  max_members: int = MAX_MEMBERS, window_s: float | None = None) -> dict[str, Any]:
    """The timeline between `since` and `until` (step end times, inclusive), bounded as the module says."""
    head, chosen, tail = timeline_parts(view, since, until, max_steps=max_steps, max_requests=max_requests,
                                        max_members=max_members, window_s=window_s)
    return head | {"steps": [step_dict(si, out) for si, out in chosen]} | tail


def step_dict(si: StepInput, out: StepOutcome) -> dict[str, Any]:
    """One step as the page reads it: its counts, KV use and members by phase."""
    members: dict[str, list[str]] = {}
    for m in out.record.members:
        members.setdefault(m.phase, []).append(m.request_id)
    return {"ts": si.end_ts, "elapsed_s": si.elapsed_s, "iteration": si.iteration,
            "context_requests": si.context_requests, "context_tokens": si.context_tokens,
            "generation_requests": si.generation_requests, "generation_tokens": si.generation_tokens,
            "kv_usage": si.kv_usage, "kv_blocks": out.predicted_blocks,
            "vllm_kv_blocks": out.observed_blocks, "members": members}


def timeline_parts(view: TimelineReads, since: float | None, until: float | None, *,
                   max_steps: int = DEFAULT_MAX_STEPS, max_requests: int = MAX_REQUESTS,
                   max_members: int = MAX_MEMBERS,
                   window_s: float | None = None) -> tuple[dict[str, Any], list[Step], dict[str, Any]]:
    """The document around its steps (the keys before `steps`, the keys after) and the steps chosen: a caller
    that keeps each step's JSON (timeline_body.py) encodes only the steps it has not seen."""
    if since is not None and until is not None and since > until:
        raise BadQuery("since must not be after until")
    outcomes = view.outcomes()
    ends = [si.end_ts for si, _ in outcomes]
    floor = since  # the earliest step end sent
    anchor = until if until is not None else (ends[-1] if ends else view.last_event_ts)
    if window_s is not None and anchor is not None:  # the steps within `window_s` of the newest (or `until`)
        floor = max(anchor - window_s, since or 0.0)
    lo = 0 if floor is None else bisect.bisect_left(ends, floor)
    hi = len(ends) if until is None else bisect.bisect_right(ends, until)
    forward = since is not None  # from `since` on; else the newest steps
    order = range(lo, hi) if forward else range(hi - 1, lo - 1, -1)
    taken = member_count = 0
    for i in order:  # at most max_steps steps and max_members member entries (big GPU batches)
        member_count += len(outcomes[i][1].record.members)
        if taken == max_steps or (member_count > max_members and taken > 0):
            break
        taken += 1
    if forward and taken < hi - lo:
        taken = _whole_ties(ends, lo, taken, hi)
    truncated = taken < hi - lo
    lo, hi = (lo, lo + taken) if forward else (hi - taken, hi)
    chosen = outcomes[lo:hi]

    kv: dict[str, list[list[float]]] = {}
    kv_shared: list[list[float]] = []
    held: dict[str, int] = {}
    for si, out in chosen:
        split = out.kv_split()
        now = dict(split.exclusive)
        for rid in held.keys() - now.keys():
            kv[rid].append([si.end_ts, 0])
        for rid, blocks in now.items():
            if held.get(rid) != blocks:
                kv.setdefault(rid, []).append([si.end_ts, blocks])
        held = now
        if (kv_shared[-1][1] if kv_shared else 0) != split.shared:
            kv_shared.append([si.end_ts, split.shared])

    t0 = chosen[0][0].start_ts if chosen else floor
    t1 = chosen[-1][0].end_ts if chosen else until
    lanes, lanes_truncated = _lanes(view, t0, t1, max_requests)
    lane_ids = {lane["request_id"] for lane in lanes}
    results = _results_of(view, lane_ids)
    block_size, pool = view.pool()
    head = {
        "since": t0, "until": t1, "now": view.last_event_ts,
        "block_size": block_size, "pool_blocks": pool, "token_budget": view.token_budget(),
        "token_budget_source": view.token_budget_source(),
        "victim_threshold_s": view.victim_threshold_s,
        "max_steps": max_steps, "window_s": window_s, "window_start": floor if window_s is not None else None,
        "truncated": truncated or lanes_truncated,
        "next_since": ends[hi] if truncated and since is not None and hi < len(ends) else None,
    }
    tail = {
        "kv": {rid: points for rid, points in kv.items() if rid in lane_ids or not lanes_truncated},
        "kv_shared": kv_shared,
        "requests": lanes,
        "victims": [_victim(r) for r in results if r.victim_seconds() > 0 and r.culprits],
        "gpu": _gpu(view, t0, t1),
    }
    return head, chosen, tail


def _gpu(view: TimelineReads, t0: float | None, t1: float | None) -> list[dict[str, Any]]:
    """The GPU's own readings over the steps sent (NVML; none without it), for the row under the KV chart."""
    if t0 is None or t1 is None:
        return []
    rows = [{"ts": g.ts, "gpu": g.gpu, "memory_used_bytes": g.memory_used_bytes,
             "memory_total_bytes": g.memory_total_bytes, "dram_bandwidth_ratio": bandwidth_ratio(g)}
            for g in view.gpu_samples(t0 - MAX_SAMPLE_AGE_S) if g.ts <= t1 + MAX_SAMPLE_AGE_S]
    return rows[-MAX_GPU_SAMPLES:]


def _whole_ties(ends: list[float], lo: int, taken: int, hi: int) -> int:
    """A page never ends inside a run of steps with the same end time (ms log stamps can tie), so paging on
    from `next_since` (inclusive) neither repeats nor skips a step: back off to the run's start, or, if the
    whole page is one run, take the run."""
    k = taken
    while k > 0 and ends[lo + k] == ends[lo + k - 1]:
        k -= 1
    if k > 0:
        return k
    while lo + taken < hi and ends[lo + taken] == ends[lo + taken - 1]:
        taken += 1
    return taken


def _lanes(view: TimelineReads, t0: float | None, t1: float | None,
           max_requests: int) -> tuple[list[dict[str, Any]], bool]:
    """Requests whose life overlaps [t0, t1], earliest arrival first, with what makes each a whale."""
    if t0 is None or t1 is None:
        return [], False
    lcs = [lc for lc in view.lifecycles()
           if lc.arrival_ts is not None and lc.arrival_ts <= t1 and (lc.end_ts is None or lc.end_ts >= t0)]
    lcs.sort(key=lambda lc: (lc.arrival_ts or 0.0, lc.request_id))
    truncated = len(lcs) > max_requests
    lcs = lcs[:max_requests]
    whales = set(view.kv_now().whales)
    for r in _results_of(view, {lc.request_id for lc in lcs}):  # whales overlap their victims: they are here
        if r.is_whale:
            whales.add(r.request_id)
        whales.update(c.request_id for c in r.culprits if c.is_whale)
    preempted: dict[str, list[dict[str, Any]]] = {}
    for p in view.preemptions():
        preempted.setdefault(p.request_id, []).append(
            {"ts": p.preempted_ts, "resumed_ts": p.resumed_ts, "confidence": p.confidence,
             "actionable": p.actionable})
    return [_lane(lc, lc.request_id in whales, view.status(lc.request_id), preempted.get(lc.request_id, []))
            for lc in lcs], truncated


def _lane(lc: RequestLifecycle, is_whale: bool, status: str, preemptions: list[dict[str, Any]]) -> dict[str, Any]:
    return {"request_id": lc.request_id, "arrival_ts": lc.arrival_ts, "scheduled_ts": lc.scheduled_ts,
            "first_token_ts": lc.first_token_ts, "finish_ts": lc.finish_ts, "aborted_ts": lc.aborted_ts,
            "prompt_tokens": lc.prompt_tokens, "completion_tokens": lc.completion_tokens,
            "is_whale": is_whale, "complete": lc.complete, "status": status, "preemptions": preemptions}


def _results_of(view: TimelineReads, ids: set[str]) -> list[AttributionResult]:
    return [r for rid in sorted(ids) if (r := view.result(rid)) is not None]


def _victim(r: AttributionResult) -> dict[str, Any]:
    gaps = r.itl_gaps
    culprits = sorted(r.culprits, key=lambda c: (-c.seconds(gaps), c.request_id))[:CULPRITS_PER_VICTIM]
    return {"request_id": r.request_id, "final": r.final, "is_whale": r.is_whale,
            "ttft_s": r.ttft_s, "ttft_baseline_s": r.ttft_baseline_s, "ttft_slowdown_s": r.ttft_slowdown_s,
            "itl_slowdown_s": r.itl_slowdown_s, "itl_gaps": gaps, "slowdown_s": r.victim_seconds(),
            "unexplained_s": r.unexplained_ttft_s + r.unexplained_itl_s * gaps,
            "culprits": [culprit_to_dict(c) | {"seconds": c.seconds(gaps)} for c in culprits]}
