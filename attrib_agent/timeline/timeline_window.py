"""The window of engine steps a timeline holds: inputs, inferred outcomes and periodic state checkpoints.

Steps are numbered by feed position (`seq`). Every `checkpoint_every`-th step keeps a copy of the scheduler
state it starts from, so a late correction re-infers from the nearest checkpoint instead of from the start,
and eviction drops whole chunks so the oldest step held always has its checkpoint.
"""

from __future__ import annotations

import bisect
from collections import Counter
from collections.abc import Callable, Sequence

from attrib_agent.timeline.model import StepRecord
from attrib_agent.timeline.sched_state import SchedState, StepInput, fact_ms
from attrib_agent.timeline.step_outcome import StepOutcome

STALE = -1  # a chunk-cut size not worked out yet (sizes are >= 0)


class StepWindow:
    def __init__(self, max_steps: int, checkpoint_every: int) -> None:
        if checkpoint_every < 1 or max_steps < 2 * checkpoint_every:
            raise ValueError("need checkpoint_every >= 1 and max_steps >= 2 * checkpoint_every")
        self.max_steps = max_steps
        self.checkpoint_every = checkpoint_every
        self._inputs: list[StepInput] = []  # every step held, in order
        # checkpoints by seq, in seq order: the state the step starts from and the timeline's fact clock when it
        # was taken (one step in `checkpoint_every`): a step holds no object of its own but its input and outcome
        self._before: dict[int, tuple[SchedState, int]] = {}
        self._ends: list[float] = []
        self._end_ms: list[int] = []  # each step's `end_ms`, in order: the preemption inference bisects it
        # (input, outcome) of the slots inferred so far: always a prefix of the slots (outcomes are set at the
        # computed frontier, which only moves back to re-infer), kept so reading them is a list copy, not a walk
        self._pairs: list[tuple[StepInput, StepOutcome]] = []
        self._records: list[StepRecord] = []  # the outcomes' records, in step: what the attribution pass reads
        self._eventful: set[int] = set()  # seqs of inferred steps that saw a preemption or a resumption (rare)
        # Kept as outcomes change rather than walked per pass: each step's membership error (counted by value),
        # and the chunk-cut size of each step with the next (`cut_max`; STALE where one of the two changed since).
        self._errors: Counter[int] = Counter()
        self._error_sum = 0
        self._cuts: list[int] = []
        self._restarts: set[int] = set()  # seqs of steps whose iteration went back: vLLM restarted (rare)
        self._last_iteration: int | None = None  # of the last step appended, dropped or not
        self.first_seq = 0
        self.next_seq = 0
        self.computed_to = 0  # steps before this seq have outcomes
        self._largest = 0

    def __len__(self) -> int:
        return len(self._inputs)

    def append(self, si: StepInput) -> None:
        if self._last_iteration is not None and si.iteration < self._last_iteration:
            self._restarts.add(si.seq)
        self._last_iteration = si.iteration
        self._inputs.append(si)
        self._ends.append(si.end_ts)
        self._end_ms.append(si.end_ms)
        self.next_seq += 1
        self._largest = max(self._largest, si.scheduled_tokens)

    def over_capacity(self) -> bool:
        return len(self._inputs) > self.max_steps

    def last_end(self) -> float | None:
        return self._ends[-1] if self._ends else None

    def largest_step(self) -> int:
        return self._largest

    def input(self, seq: int) -> StepInput:
        return self._inputs[seq - self.first_seq]

    def checkpoint(self, seq: int) -> tuple[SchedState, int] | None:
        """The state step `seq` starts from and the fact clock when it was taken, if it holds a checkpoint."""
        return self._before.get(seq)

    def set_checkpoint(self, seq: int, state: SchedState, clock: int) -> None:
        self._before[seq] = (state, clock)

    def _get(self, seq: int | None) -> StepInput | None:
        if seq is None or not self.first_seq <= seq < self.next_seq:
            return None
        return self._inputs[seq - self.first_seq]

    def set_outcome(self, si: StepInput, outcome: StepOutcome) -> None:
        """Record what was inferred for step `si` (at most one past the last one inferred)."""
        seq = si.seq
        if outcome.preemptions or outcome.resumes:
            self._eventful.add(seq)
        else:
            self._eventful.discard(seq)
        i = seq - self.first_seq
        record = outcome.record
        error = record.membership_error
        if i < len(self._pairs):
            was = self._records[i].membership_error
            if was != error:  # re-inferred: mostly the same error
                self._count_error(was, -1)
                self._count_error(error, 1)
            self._pairs[i] = (si, outcome)
            self._records[i] = record
        elif i == len(self._pairs):
            self._pairs.append((si, outcome))
            self._records.append(record)
            self._cuts.append(STALE)
            self._errors[error] += 1
            self._error_sum += error
        else:
            raise RuntimeError("outcomes are inferred in order")
        self._cuts[i] = STALE  # its cut reads it and the next step, the previous one's reads it
        if i:
            self._cuts[i - 1] = STALE

    def _count_error(self, error: int, n: int) -> None:
        self._errors[error] += n
        self._error_sum += n * error
        if not self._errors[error]:
            del self._errors[error]

    def is_checkpoint(self, seq: int) -> bool:
        return seq == self.first_seq or seq % self.checkpoint_every == 0

    def oldest_clock(self) -> int | None:
        """The fact clock of the oldest checkpoint held."""
        return min((clock for _, clock in self._before.values()), default=None)

    def checkpoints(self) -> int:
        return len(self._before)

    def rewind(self, seq: int) -> SchedState:
        """Move the computed frontier back to the last checkpoint at or before `seq`; returns its state."""
        at = self.checkpoint_at_or_before(seq)
        found = self._before.get(at)
        if found is None:
            raise RuntimeError("the oldest step held has no checkpoint")
        self.computed_to = at
        return found[0]

    def checkpoint_at_or_before(self, seq: int) -> int:
        """The latest step at or before `seq` that holds a checkpoint (the oldest step held has one)."""
        before, first = self._before, self.first_seq
        while seq > first and seq not in before:
            seq -= 1
        return seq

    def first_seq_ending_after(self, ts: float) -> int | None:
        i = bisect.bisect_right(self._ends, ts)
        return self.first_seq + i if i < len(self._ends) else None

    def start_of(self, seq: int | None) -> float | None:
        si = self._get(seq)
        return None if si is None else si.start_ts

    def end_of(self, seq: int | None) -> float | None:
        si = self._get(seq)
        return None if si is None else si.end_ts

    def seq_matches(self, seq: int | None, ts: float | None) -> bool:
        """Whether vLLM's time `ts` falls on step `seq` (an equal millisecond on the previous step is allowed)."""
        if ts is None:
            return True
        if seq is None:
            return False
        if seq < self.first_seq:
            return True  # gone from the window: nothing left to correct
        si = self._get(seq)
        if si is None:
            return False
        m = fact_ms(ts)
        prev = self._get(seq - 1)
        return si.end_ms >= m and (prev is None or prev.end_ms <= m)

    def outcomes(self) -> list[tuple[StepInput, StepOutcome]]:
        return list(self._pairs)

    def held_outcomes(self) -> Sequence[tuple[StepInput, StepOutcome]]:
        """`outcomes()` without the copy, for a reader that keeps nothing of it (a copy of ~36,000 pairs at GPU
        rates touches every pair: ~0.3-0.8 ms)."""
        return self._pairs

    def records(self) -> list[StepRecord]:
        """`[o.record for _, o in outcomes()]`, kept: a copy of a list, not a walk of the window."""
        return list(self._records)

    def ends(self) -> list[float]:
        """The end of each step in `outcomes()` (the records' `end_ts`), in order."""
        return self._ends[:len(self._pairs)]

    def ends_ms(self) -> list[int]:
        """Every step held's `end_ms`, in order (the outcomes' are its first `len(outcomes())`): the list kept,
        not a copy, for a reader that only searches it."""
        return self._end_ms

    def membership(self) -> tuple[int, int, int, int]:
        """(steps inferred, of which with no membership error, summed error, largest error), kept as outcomes
        change: what walking every record's `membership_error` gives."""
        return len(self._records), self._errors.get(0, 0), self._error_sum, max(self._errors, default=0)

    def cut_max(self, cut: Callable[[StepRecord, StepRecord], int]) -> int:
        """The largest `cut(step, next step)` over the inferred steps (0 with fewer than two): each pair's answer
        kept until one of its two outcomes changes (`cut` is a function of the two records)."""
        records, cuts, last = self._records, self._cuts, len(self._records) - 1
        i = 0
        while True:
            try:
                i = cuts.index(STALE, i)  # a scan in C: the stale ones are the few re-inferred since
            except ValueError:
                break
            if i == last:  # its next step is still to come: stale until then, 0 meanwhile
                break
            cuts[i] = cut(records[i], records[i + 1])
        return max(max(cuts, default=0), 0)

    def holds_restart(self) -> bool:
        """Whether a step held follows a vLLM restart (its iteration went back): only then can the inference
        end a request with the old server, so a reader that needs no other inferred fact can skip inferring."""
        return bool(self._restarts)

    def eventful(self) -> list[int]:
        """Positions in `outcomes()` of the steps that saw a preemption or a resumption, in order: the
        preemption inference reads these few instead of walking every step held."""
        return sorted(seq - self.first_seq for seq in self._eventful if seq - self.first_seq < len(self._pairs))

    def evictable(self, before_ts: float | None) -> int | None:
        """The checkpoint up to which steps may go: all earlier steps end before `before_ts` (or every step
        does), or (None) the first checkpoint that brings the window back within `max_steps`."""
        if before_ts is not None and self._ends and self._ends[-1] < before_ts and self.computed_to == self.next_seq:
            return self.next_seq  # all of it: the inference's current state starts the next step
        best: int | None = None
        floor = self.next_seq - self.max_steps
        for seq in sorted(self._before):  # the checkpoints, in step order
            i = seq - self.first_seq
            if i == 0 or seq > self.computed_to:
                continue
            if before_ts is None:
                if seq >= floor:
                    return seq
            elif self._ends[i - 1] < before_ts:
                best = seq
            else:
                break
        return best

    def drop_before(self, seq: int) -> None:
        n = seq - self.first_seq
        del self._inputs[:n]
        self._before = {q: c for q, c in self._before.items() if q >= seq}
        del self._ends[:n]
        del self._end_ms[:n]
        for record in self._records[:n]:
            self._count_error(record.membership_error, -1)
        del self._pairs[:n]
        del self._records[:n]
        del self._cuts[:n]
        self._eventful = {q for q in self._eventful if q >= seq}
        self._restarts = {q for q in self._restarts if q >= seq}
        self.first_seq = seq
