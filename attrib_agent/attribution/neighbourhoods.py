"""The windows of a long busy period that its victims need, found by a sweep over arrival-ordered requests.

Under continuous load a busy period never closes; each victim is re-simulated in a window around it instead
(`Attributor._periods`). Finding a victim's window reads only the requests near it: arrivals are sorted once
(O(N log N) for a chain of N requests), the earliest request still in flight at a time is a binary search on
the running maximum of the ends, and a window's requests are collected from its latest arrival backwards,
stopping at `max_len` requests or at the earliest one in flight at its start. Per victim that is
O(log N + k), k the requests arriving within its window (in flight or ended within it), not O(N): the work no
longer grows with how long the engine has been busy (a scan would be O(N) per victim and per window,
quadratic in a long period). Same windows as that scan (a test compares them on random chains).
"""

from __future__ import annotations

import bisect
import itertools
from collections.abc import Callable, Sequence

from attrib_agent.attribution.sim_types import SimRequest


class _Chain:
    """The chain in arrival order with the running maximum of the ends: the earliest request whose end reaches
    a time is the first index where that maximum does."""

    def __init__(self, chain: Sequence[tuple[SimRequest, float]]) -> None:
        ordered = sorted(chain, key=lambda x: (x[0].arrival_ts, x[0].request_id))
        self.reqs = [r for r, _ in ordered]
        self.arrivals = [r.arrival_ts for r in self.reqs]
        self.ends = [e for _, e in ordered]
        self.reach = list(itertools.accumulate(self.ends, max))

    def earliest_reaching(self, ts: float) -> int:
        """Index of the first request (by arrival) whose end is >= ts; len() when none."""
        return bisect.bisect_left(self.reach, ts)

    def window(self, lo: float, hi: float, most: int) -> list[SimRequest]:
        """The last `most` (by arrival) of the requests ending at or after `lo` that arrived by `hi`."""
        out: list[SimRequest] = []
        stop = self.earliest_reaching(lo)
        for j in range(bisect.bisect_right(self.arrivals, hi) - 1, stop - 1, -1):
            if self.ends[j] >= lo:
                out.append(self.reqs[j])
                if len(out) >= most:
                    break
        out.reverse()
        return out


def bounded_neighbourhoods(chain: Sequence[tuple[SimRequest, float]], victims: set[str], max_len: int,
                           lookback_s: float, snap: Callable[[float], float]
                           ) -> list[tuple[float, list[SimRequest], set[str]]]:
    """Windows bounded in time, each run from the observed engine state at its start (`SimStart`).

    A victim's window starts at the earliest arrival among the requests that overlapped it, but no more than
    `lookback_s` before its own arrival, moved back by `snap` (to an engine step's end, where the state is
    observed, and to a grid so that nearby victims share a start and their runs). What was in flight then is in
    the state, so the window needs no reaching further back: its length is the victim's own life plus at most
    `lookback_s` (and a grid step), however long the engine has been busy. Returns (start, the requests in
    flight at the start or arriving from it to the window's last end, the latest `max_len`, and the victims it
    is for) per window: each victim in exactly one, though others' windows may hold it too."""
    c = _Chain(chain)
    out: list[tuple[float, list[SimRequest], set[str]]] = []
    group: tuple[float, float] | None = None
    members: set[str] = set()
    for i, req in enumerate(c.reqs):
        if req.request_id not in victims:
            continue
        first = c.arrivals[min(c.earliest_reaching(c.arrivals[i]), i)]
        lo, end = snap(max(first, c.arrivals[i] - lookback_s)), c.ends[i]
        if group is not None and len(c.window(min(group[0], lo), max(group[1], end), max_len + 1)) <= max_len:
            group = (min(group[0], lo), max(group[1], end))
            members.add(req.request_id)
            continue
        if group is not None:
            out.append((group[0], c.window(*group, max_len), members))
        group, members = (lo, end), {req.request_id}
    if group is not None:
        out.append((group[0], c.window(*group, max_len), members))
    return out
