"""Inferring the steps in order, and again from a checkpoint when facts about a request change.

A request's span (or its first log line, or its abort) can only change steps it can have taken part in:
those that ended after it was queued, and for a span on a request the steps already hold, those from its
first admission on (`_admission`). So a change marks the inference dirty from there, and the next
refresh re-infers from the checkpoint before that point, using everything known by then. The result is the
same as inferring every step again with all facts, whenever refreshes happen: that is what makes a live
timeline and a replayed one agree. Re-inference stops early where it converges with the previous pass.
"""

from __future__ import annotations

from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.sched_state import Geometry, SchedState, Track, fact_ms
from attrib_agent.timeline.step_outcome import Departure
from attrib_agent.timeline.steps import STAMP_RESOLUTION_S, infer_step
from attrib_agent.timeline.timeline_window import StepSlot, StepWindow


class TimelineInference:
    def __init__(self, book: LifecycleBook, window: StepWindow, geometry: Geometry, budget: int) -> None:
        self.book = book
        self.window = window
        self.geometry = geometry
        self.state = SchedState(budget=budget)  # after the last inferred step
        self._departed: dict[str, tuple[int, Departure]] = {}  # request -> (step that inferred it, departure)
        self._dirty: int | None = None
        self._clock = 0  # counts changes of facts: a request's, or the pool geometry's (key None)
        self._changes: dict[str | None, int] = {}  # the clock at each one's last change
        self.inferred = 0  # steps inferred, first passes and re-inference alike (benchmarks/reinference.py)
        self.reinferred = 0  # of which re-inferred: steps that already had an outcome

    def departure(self, request_id: str) -> Departure | None:
        found = self._departed.get(request_id)
        return None if found is None else found[1]

    def departures(self) -> int:
        return len(self._departed)

    def track(self, request_id: str) -> Track | None:
        return self.state.tracked().get(request_id)

    def set_geometry(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self._note(None, self.window.first_seq)

    def request_changed(self, request_id: str, queue_ts: float, *, span_landed: bool = False) -> None:
        """Its facts changed: every inferred step that ended after it was queued is inferred again; when only its
        span landed (it was in the book already), every inferred step from its first admission on."""
        seq = self.window.first_seq_ending_after(queue_ts)
        if span_landed and seq is not None:
            seq = self._admission(request_id, seq)
        self._note(request_id, seq if seq is not None and seq < self.window.computed_to else None)

    def _admission(self, request_id: str, queued: int) -> int:
        """The first step a landed span can change: the request's first admission (the frontier if none yet).

        Before it the request waits fresh (no output, never admitted), and the step inference reads a fresh
        waiting request's facts in two places only (steps.py): `_enqueue` skips it when it was aborted before the
        step or its whole life ended before it, and `_leave_before` drops it when aborted or finished by then,
        else copies its prompt in. `_admit` takes the queue in order by phase, and a fresh request's phase is
        fixed (prefill); nothing else reads a waiting request. A span clears the abort, so when its finish is
        after the step before the admission, those steps come out the same, and the state differs only in the
        waiting request's prompt, which the admitting step's `_leave_before` copies in again before any read.
        The admission read here comes from steps before any pending change, or lies past it (then the pending
        change starts earlier). Not held, or gone without an admission: from its queueing (`queued`)."""
        found = self._departed.get(request_id)
        admitted = found[1].admitted_seq if found is not None else None
        if found is None:
            track = next((t for t in (*self.state.running, *self.state.waiting) if t.rid == request_id), None)
            if track is None:
                return queued
            admitted = self.window.computed_to if track.admitted_seq is None else track.admitted_seq
        lc = self.book.get(request_id)
        if admitted is None or lc is None or lc.aborted_ts is not None:
            return queued
        if admitted - 1 >= self.window.first_seq and lc.finish_ts is not None \
                and fact_ms(lc.finish_ts) <= self.window.slot(admitted - 1).si.end_ms:
            return queued
        return admitted

    def _note(self, key: str | None, seq: int | None) -> None:
        """Only a change to steps already inferred needs re-inference (and can stop a convergence)."""
        if seq is None:
            return
        self._clock += 1
        self._changes[key] = self._clock
        self._dirty = seq if self._dirty is None else min(self._dirty, seq)

    def refresh(self) -> None:
        """Infer the steps not inferred yet, first re-inferring from the checkpoint before the earliest change."""
        w = self.window
        valid_to, frontier = w.computed_to, self.state
        stale: dict[str, tuple[int, Departure]] = {}
        if self._dirty is not None and self._dirty < w.computed_to:
            self.state = w.rewind(max(self._dirty, w.first_seq)).copy()
            stale = {rid: v for rid, v in self._departed.items() if v[0] >= w.computed_to}
            self._departed = {rid: v for rid, v in self._departed.items() if v[0] < w.computed_to}
        restart = w.computed_to
        self.reinferred += max(valid_to - restart, 0)  # at most: a convergence takes back what it skips
        self._dirty = None
        while w.computed_to < w.next_seq:
            slot = w.slot(w.computed_to)
            if w.is_checkpoint(slot.si.seq):
                if restart < slot.si.seq < valid_to and self._converged(slot, w.slot(valid_to - 1).si.start_ts):
                    self._departed.update({rid: v for rid, v in stale.items() if v[0] >= slot.si.seq})
                    self.reinferred -= valid_to - slot.si.seq
                    self.state, w.computed_to = frontier, valid_to
                    continue
                slot.before, slot.clock = self.state.copy(), self._clock
            outcome = infer_step(self.state, slot.si, self.book, self.geometry)
            self.inferred += 1
            w.set_outcome(slot, outcome)
            for d in outcome.departures:
                self._departed[d.request_id] = (slot.si.seq, d)
            w.computed_to += 1

    def _converged(self, slot: StepSlot, frontier_start: float) -> bool:
        """Whether the previous pass's outcomes from `slot` up to the frontier still hold: same state there,
        and no request it holds, or queues before the frontier, has learnt anything since it was taken."""
        if slot.before is None or not slot.before.same_as(self.state):
            return False
        tracked = self.state.tracked()
        cursor = self.state.cursor
        for rid, clock in self._changes.items():
            if clock <= slot.clock:
                continue
            if rid is None or rid in tracked:
                return False
            entry = self.book.entry(rid)
            if entry is not None and (cursor is None or (entry.queue_ts, entry.order) > cursor) \
                    and entry.queue_ts < frontier_start + STAMP_RESOLUTION_S:
                return False
        return True

    def drop_before(self, seq: int) -> None:
        """The window lost its steps before `seq`: forget what only they knew."""
        self.window.drop_before(seq)
        self._departed = {rid: v for rid, v in self._departed.items() if v[0] >= seq}
        oldest = self.window.oldest_clock()  # a change older than every checkpoint cannot stop a convergence
        self._changes = {k: c for k, c in self._changes.items() if oldest is None or c > oldest}

    def forget(self, request_id: str) -> None:
        self._departed.pop(request_id, None)
