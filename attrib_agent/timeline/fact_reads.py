"""How far a re-inference may skip: the steps a request's changed facts cannot reach, from what the step
inference reads of them (steps.py, step_tokens.py, step_counts.py).

A re-inference that reaches a checkpoint in the same state as the stored pass did may take the stored
outcomes up to the first step that a fact changed since that pass can alter. A request's lifecycle is read:
- at its enqueueing (`_enqueue`: skipped when aborted, or its whole life ended before the step);
- every step it is held (`_leave_before`: dropped when aborted or finished by then, its prompt copied in;
  `_finish`: departs when finished by the step's end);
- while it is a decode candidate for an unreported finish (`pick_unreported_finishes`: a complete one is
  not a candidate, which changes the pick only when it was the one picked);
- in prefill (`_prefill_done`: its first-token time), and once admitted its prompt sizes its chunks.
So a span (the one change that only adds facts) cannot alter a step before the request's first admission when
its finish is later (nothing reads a fresh waiting request but to drop it; `_admit` takes the queue by phase),
nor, once it has output and the state holds the prompt the span gives, any step before the first one where
`_finished_by` can answer True with the span (outputs grow by at most one a step) and before the stored
pass's own departure of it (until then every read answered "stays" there too: a True, a pick or an abort
makes it depart). Anything else (a new request, an abort, the pool geometry) alters every step from its
enqueueing, or from the checkpoint if it is held there.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.timeline.sched_state import SchedState, Track, fact_ms
from attrib_agent.timeline.step_outcome import Departure
from attrib_agent.timeline.timeline_window import StepWindow

STAMP_S = 0.001  # log stamps and span times are millisecond-truncated
END_MARGIN_S = 0.002  # a step ending this much before a time ends before its millisecond (round vs floor)


@dataclass(frozen=True, slots=True)
class Change:
    """The clock of a request's last change, and of its last change that was more than its span landing."""

    clock: int
    hard_clock: int


@dataclass(slots=True)
class StoredPass:
    """The pass being replaced, from the restart on: its departures (by the step that inferred them) and the
    state it reached at the frontier (`valid_to`)."""

    window: StepWindow
    book: LifecycleBook
    departed: dict[str, tuple[int, Departure]]
    frontier: SchedState
    valid_to: int
    _held: dict[str, Track] | None = None

    def holds_until(self, state: SchedState, seq: int, since: int, changes: dict[str | None, Change]) -> int:
        """The first step from `seq` whose stored outcome a change after clock `since` may alter (`valid_to`
        when none can), given that `state` is the stored pass's state at `seq`."""
        bound = self.valid_to
        tracked = state.tracked()
        for rid, change in changes.items():
            if change.clock <= since:
                continue
            if rid is None:
                return seq
            reach = self._reach(rid, tracked.get(rid), state.cursor, seq, change.hard_clock > since)
            bound = min(bound, reach)
            if bound <= seq:
                return seq
        return bound

    def _reach(self, rid: str, track: Track | None, cursor: tuple[float, int] | None, seq: int, hard: bool) -> int:
        entry = self.book.entry(rid)
        if track is None:
            if entry is None or (cursor is not None and (entry.queue_ts, entry.order) <= cursor):
                return self.valid_to  # gone before `seq`, or forgotten: no step from here reads it
            enqueue = self._ending_after(entry.queue_ts - 2 * STAMP_S)  # a step starting before it took it
            return enqueue if hard else max(enqueue, self._admission(rid, entry.lifecycle, enqueue))
        lc = entry.lifecycle if entry is not None else None
        if hard or lc is None or lc.aborted_ts is not None:
            return seq
        if track.outputs == 0:
            return self._admission(rid, lc, seq) if track.admitted_seq is None and not track.resuming else seq
        if lc.prompt_tokens is not None and track.prompt != lc.prompt_tokens:
            return seq  # the span's prompt, copied in at every step, is not the one the stored pass held
        return min(self._finish_read(lc, track.outputs, seq), self._departure(rid, seq))

    def _admission(self, rid: str, lc: RequestLifecycle, otherwise: int) -> int:
        """Its first admission in the stored pass when its span leaves the steps before it as they were; else
        `otherwise`."""
        if self._held is None:
            self._held = self.frontier.tracked()
        admitted = first_admission(rid, self.departed, self._held.get, self.valid_to)
        return admitted if admitted is not None and span_spares_waiting(lc, admitted, self.window) else otherwise

    def _finish_read(self, lc: RequestLifecycle, outputs: int, seq: int) -> int:
        """The first step from `seq` where `_finished_by` may answer True for a request with `outputs` there."""
        first = self.valid_to
        limit = lc.completion_tokens if lc.complete else lc.max_tokens
        if limit is not None and (limit > 0 or not lc.complete):  # a complete one counts only a positive limit
            first = min(first, seq + max(limit - outputs - 1, 0))  # `_finish` sees one more output than before
        if lc.complete and lc.finish_ts is not None:
            first = min(first, self._ending_after(lc.finish_ts - END_MARGIN_S))
        return first

    def _departure(self, rid: str, seq: int) -> int:
        """The step whose stored outcome has it depart (the frontier if it is still held there)."""
        found = self.departed.get(rid)
        if found is not None and found[0] >= seq:
            return found[0]
        if self._held is None:
            self._held = self.frontier.tracked()
        return self.valid_to if rid in self._held else seq

    def _ending_after(self, ts: float) -> int:
        found = self.window.first_seq_ending_after(ts)
        return self.valid_to if found is None else min(found, self.valid_to)


def span_spares_waiting(lc: RequestLifecycle, admitted: int, window: StepWindow) -> bool:
    """Whether the steps before `admitted`, where the request waited fresh, read the same of it with its span
    as without: not aborted (a span clears an abort) and not finished by the step before (nor, then, by the
    step that enqueued it)."""
    if lc.aborted_ts is not None:
        return False
    return admitted - 1 < window.first_seq or lc.finish_ts is None \
        or fact_ms(lc.finish_ts) > window.input(admitted - 1).end_ms


def first_admission(rid: str, departed: dict[str, tuple[int, Departure]], held: Callable[[str], Track | None],
                    frontier: int) -> int | None:
    """A request's first admission in a pass: from its departure, else from its track at the pass's frontier
    (the frontier itself when it still waits there); None when it left unadmitted or neither knows it."""
    found = departed.get(rid)
    if found is not None:
        return found[1].admitted_seq
    track = held(rid)
    if track is None:
        return None
    return frontier if track.admitted_seq is None else track.admitted_seq
