"""The naive baseline the engine is scored against: blame in proportion to overlap time.

Every request in flight while the victim waited for its first token is blamed for a share of the
victim's TTFT slowdown proportional to how long it overlapped that wait (the correlation approach that
studies find near chance on noisy data). It knows nothing of KV, budgets or admission.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrib_agent.timeline.model import RequestLifecycle


def overlap_blame(
    victim: RequestLifecycle, others: Iterable[RequestLifecycle], slowdown_s: float
) -> dict[str, float]:
    """Seconds of `slowdown_s` per other request id, proportional to overlap with [arrival, first token]."""
    if victim.arrival_ts is None or victim.first_token_ts is None or slowdown_s <= 0:
        return {}
    t0, t1 = victim.arrival_ts, victim.first_token_ts
    overlaps: dict[str, float] = {}
    for o in others:
        if o.request_id == victim.request_id or o.arrival_ts is None:
            continue
        end = o.end_ts if o.end_ts is not None else t1
        ov = min(t1, end) - max(t0, o.arrival_ts)
        if ov > 0:
            overlaps[o.request_id] = ov
    total = sum(overlaps.values())
    if total <= 0:
        return {}
    return {rid: slowdown_s * ov / total for rid, ov in overlaps.items()}
