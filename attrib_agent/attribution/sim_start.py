"""The engine state a bounded re-simulation window starts from, read off the timeline's steps.

A window of a never-idle busy period starts at an engine step's end, where the timeline observed who ran
(the step's members, their tokens and blocks in KV) and who waited (arrived, not finished, not in the step:
queued, or preempted when scheduled before). Counterfactual worlds drop their removed requests from it.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence

from attrib_agent.attribution.sim_types import InProgress, SimRequest, SimStart
from attrib_agent.timeline.model import RequestLifecycle, StepRecord


class StepIndex:
    """The steps held, by end time: the state at a time is the one after the last step ended by then."""

    def __init__(self, steps: Sequence[StepRecord], ends: list[float] | None = None) -> None:
        """`ends`: the steps' end times when the caller keeps them (a timeline's steps end in order)."""
        if ends is not None and len(ends) == len(steps):
            self.steps, self.ends = steps, ends
        else:
            self.steps = sorted(steps, key=lambda s: s.end_ts)
            self.ends = [s.end_ts for s in self.steps]

    def before(self, ts: float) -> StepRecord | None:
        """The last step that ended at or before `ts` (None if no step held did)."""
        i = bisect.bisect_right(self.ends, ts)
        return self.steps[i - 1] if i else None

    def snapper(self, grid_s: float) -> SnapToStep:
        return SnapToStep(self, grid_s)


class SnapToStep:
    """Moves a wanted window start back to a multiple of `grid_s` (nearby victims share it), then to the end of
    the step before it (where the state is observed); left on the grid when no step held ended by then."""

    def __init__(self, index: StepIndex, grid_s: float) -> None:
        self._index, self._grid = index, grid_s

    def __call__(self, ts: float) -> float:
        snapped = math.floor(ts / self._grid) * self._grid if self._grid > 0 else ts
        step = self._index.before(snapped)
        return step.end_ts if step is not None else snapped


def observed_start(step: StepRecord, window: Sequence[SimRequest], ends: Mapping[str, float],
                   lcs: Mapping[str, RequestLifecycle]) -> tuple[SimStart, list[SimRequest]]:
    """The state after `step` over the window's requests, and the requests the run takes: those in flight then
    (in the state) and those arriving after it (the ones that ended by then are dropped)."""
    t = step.end_ts
    members = {m.request_id: m for m in step.members}
    running: list[tuple[float, InProgress]] = []
    queued: list[tuple[int, float, InProgress]] = []
    kept: list[SimRequest] = []
    for r in window:
        if r.arrival_ts > t:
            kept.append(r)
            continue
        if ends.get(r.request_id, math.inf) <= t:
            continue  # ended by the start: not on the engine
        kept.append(r)
        lc = lcs.get(r.request_id)
        sched = lc.scheduled_ts if lc is not None and lc.scheduled_ts is not None and lc.scheduled_ts <= t else None
        first = lc.first_token_ts if lc is not None and lc.first_token_ts is not None and lc.first_token_ts <= t \
            else None
        m = members.get(r.request_id)
        if m is not None:
            outputs = max(m.context_tokens - r.prompt_tokens + 1, 0)
            running.append((sched if sched is not None else r.arrival_ts,
                            InProgress(r.request_id, m.context_tokens, outputs, True, m.blocks, sched, first)))
        else:  # queued: preempted ones (scheduled before) at the front, as vLLM puts them back
            queued.append((0 if sched is not None else 1, sched if sched is not None else r.arrival_ts,
                           InProgress(r.request_id, 0, 0, False, 0, sched, first)))
    state = [ip for _, ip in sorted(running, key=lambda x: x[0])]
    state += [ip for _, _, ip in sorted(queued, key=lambda x: (x[0], x[1]))]
    return SimStart(t, tuple(state)), kept


def without(start: SimStart, removed: frozenset[str]) -> SimStart:
    """The state of a world where `removed` never ran: they leave the engine (their KV and queue places freed)."""
    if not removed:
        return start
    return SimStart(start.ts, tuple(ip for ip in start.state if ip.request_id not in removed))
