"""Inferring the steps in order, and again from a checkpoint when facts about a request change.

A request's span (or its first log line, or its abort) can only change steps it can have taken part in:
those that ended after it was queued, and for a span on a request the steps already hold, those from its
first admission on (`_admission`). So a change marks the inference dirty from there, and the next
refresh re-infers from the checkpoint before that point, using everything known by then. The result is the
same as inferring every step again with all facts, whenever refreshes happen: that is what makes a live
timeline and a replayed one agree. Re-inference stops early where it converges with the previous pass.
"""

from __future__ import annotations

from collections.abc import Iterable

from attrib_agent.timeline.fact_reads import Change, StoredPass, first_admission, span_spares_waiting
from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.sched_state import Geometry, SchedState, Track
from attrib_agent.timeline.step_outcome import Departure
from attrib_agent.timeline.steps import infer_step
from attrib_agent.timeline.timeline_window import StepWindow


class TimelineInference:
    def __init__(self, book: LifecycleBook, window: StepWindow, geometry: Geometry, budget: int) -> None:
        self.book = book
        self.window = window
        self.geometry = geometry
        self.state = SchedState(budget=budget)  # after the last inferred step
        # request -> (step that inferred it, departure), in the order of those steps: a re-inference takes back
        # the departures from its restart on, a suffix, and an eviction the ones before its cut, a prefix
        self._departed: dict[str, tuple[int, Departure]] = {}
        self._dirty: int | None = None
        self._clock = 0  # counts changes of facts: a request's, or the pool geometry's (key None)
        self._changes: dict[str | None, Change] = {}  # the clock at each one's last change (and last non-span one)
        self.inferred = 0  # steps inferred, first passes and re-inference alike (benchmarks/reinference.py)
        self.reinferred = 0  # of which re-inferred: steps that already had an outcome

    def announce_budget(self, budget: int) -> None:
        """vLLM named its step budget (its start-up line): steps inferred from now on read it as at least that
        (the line comes before the first step; a later one does not re-infer the steps before it)."""
        self.state.budget = max(self.state.budget, budget)

    def departure(self, request_id: str) -> Departure | None:
        found = self._departed.get(request_id)
        return None if found is None else found[1]

    def departures(self) -> int:
        return len(self._departed)

    def track(self, request_id: str) -> Track | None:
        return self.state.tracked().get(request_id)

    def held_between(self, request_ids: Iterable[str]) -> tuple[int, int] | None:
        """The first and last step (seqs) whose holdings can name any of these requests: each from its first
        admission to the step that inferred its departure, or to the last step while it is held (an empty range
        when none was admitted); None when one is unknown here. Refreshed first by the caller."""
        tracked: dict[str, Track] | None = None
        lo, hi = self.window.next_seq, -1
        for rid in request_ids:
            found = self._departed.get(rid)
            if found is not None:
                admitted, last = found[1].admitted_seq, found[0]
            else:
                tracked = self.state.tracked() if tracked is None else tracked
                t = tracked.get(rid)
                if t is None:
                    return None
                admitted, last = t.admitted_seq, self.window.next_seq - 1
            if admitted is not None:
                lo, hi = min(lo, admitted), max(hi, last)
        return lo, hi

    def set_geometry(self, geometry: Geometry) -> None:
        self.geometry = geometry
        self._note(None, self.window.first_seq, hard=True)

    def request_changed(self, request_id: str, queue_ts: float, *, span_landed: bool = False) -> None:
        """Its facts changed: every inferred step that ended after it was queued is inferred again; when only its
        span landed (it was in the book already), every inferred step from its first admission on."""
        seq = self.window.first_seq_ending_after(queue_ts)
        if span_landed and seq is not None:
            seq = self._admission(request_id, seq)
        self._note(request_id, seq if seq is not None and seq < self.window.computed_to else None, hard=not span_landed)

    def _admission(self, request_id: str, queued: int) -> int:
        """The first step a landed span can change: the request's first admission (the frontier if none yet),
        see fact_reads.py. The admission read here comes from steps before any pending change, or lies past it
        (then the pending change starts earlier). Not held, or gone without an admission: from its queueing."""
        state = self.state
        admitted = first_admission(request_id, self._departed, lambda rid: next(
            (t for t in (*state.running, *state.waiting) if t.rid == rid), None), self.window.computed_to)
        lc = self.book.get(request_id)
        if admitted is None or lc is None or not span_spares_waiting(lc, admitted, self.window):
            return queued
        return admitted

    def _note(self, key: str | None, seq: int | None, *, hard: bool) -> None:
        """Only a change to steps already inferred needs re-inference (and can stop a convergence). `hard`: more
        than a span landing on a request the steps hold (fact_reads.py bounds what a span can alter)."""
        if seq is None:
            return
        self._clock += 1
        old = self._changes.get(key)
        self._changes[key] = Change(self._clock, self._clock if hard else 0 if old is None else old.hard_clock)
        self._dirty = seq if self._dirty is None else min(self._dirty, seq)

    def refresh(self, until: int | None = None) -> None:
        """Infer the steps not inferred yet, first re-inferring from the checkpoint before the earliest change.

        `until`: new steps only up to that seq (an eviction needs its checkpoint, not the newest steps, which a
        span landing later would make it infer again); a re-inference still goes to where the last pass ended.

        At each checkpoint where the state is the one the stored pass had there, the stored outcomes are kept
        up to the last checkpoint before the first step a change since that pass can alter (fact_reads.py):
        the whole rest when none can (convergence), else a stretch, after which re-inference goes on."""
        w = self.window
        valid_to, frontier = w.computed_to, self.state
        stale: dict[str, tuple[int, Departure]] = {}
        if self._dirty is not None and self._dirty < w.computed_to:
            self.state = w.rewind(max(self._dirty, w.first_seq)).copy()
            stale = self._take_from(w.computed_to)
        restart = loaded = w.computed_to  # `loaded`: the checkpoint the state is an unchanged copy of
        stored = StoredPass(w, self.book, stale, frontier, valid_to)
        self.reinferred += max(valid_to - restart, 0)  # at most: a skip takes back what it skips
        self._dirty = None
        stop = w.next_seq if until is None else min(w.next_seq, max(until, valid_to))
        while w.computed_to < stop:
            seq = w.computed_to
            si = w.input(seq)
            if w.is_checkpoint(seq):
                held = w.checkpoint(seq)
                if seq < valid_to and held is not None \
                        and (seq == loaded or held[0].same_as(self.state, self._span_prompt)):
                    upto = stored.holds_until(held[0], seq, held[1], self._changes)
                    target = valid_to if upto >= valid_to else w.checkpoint_at_or_before(upto)
                    at = None if target == valid_to else w.checkpoint(target)
                    state = frontier if at is None else at[0]
                    if target > seq and state is not None:
                        for rid, v in stale.items():  # at the end, in step order, as if inferred again
                            if seq <= v[0] < target:
                                self._departed.pop(rid, None)
                                self._departed[rid] = v
                        self.reinferred -= target - seq
                        self.state, w.computed_to, loaded = state, target, target
                        continue
                w.set_checkpoint(seq, self.state.copy(), self._clock)
            outcome = infer_step(self.state, si, self.book, self.geometry)
            self.inferred += 1
            w.set_outcome(si, outcome)
            for d in outcome.departures:
                self._departed.pop(d.request_id, None)  # at the end: the order of the steps
                self._departed[d.request_id] = (seq, d)
            w.computed_to += 1

    def _take_from(self, seq: int) -> dict[str, tuple[int, Departure]]:
        """Remove and return the departures inferred at `seq` or later (in step order): the suffix of
        `_departed`, walked from its end, so the cost is what is taken back, not every departure held."""
        departed = self._departed
        taken: list[tuple[str, tuple[int, Departure]]] = []
        for rid, found in reversed(departed.items()):
            if found[0] < seq:
                break
            taken.append((rid, found))
        for rid, _ in taken:
            del departed[rid]
        return dict(reversed(taken))

    def _span_prompt(self, request_id: str) -> bool:
        lc = self.book.get(request_id)
        return lc is not None and lc.complete and lc.prompt_tokens is not None

    def drop_before(self, seq: int) -> None:
        """The window lost its steps before `seq`: forget what only they knew."""
        self.window.drop_before(seq)
        gone = []  # the prefix of `_departed` inferred before `seq`
        for rid, found in self._departed.items():
            if found[0] >= seq:
                break
            gone.append(rid)
        for rid in gone:
            del self._departed[rid]
        oldest = self.window.oldest_clock()  # a change older than every checkpoint cannot stop a convergence
        self._changes = {k: c for k, c in self._changes.items() if oldest is None or c.clock > oldest}

    def forget(self, request_id: str) -> None:
        self._departed.pop(request_id, None)
