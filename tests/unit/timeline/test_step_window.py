"""The window's kept list of inferred outcomes and the preemption pass's step-end index: the shortcuts the
timeline reads instead of walking every step held, checked against the walks they replace."""

from __future__ import annotations

import random
from dataclasses import fields

from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.timeline.model import StepRecord
from attrib_agent.timeline.preemption import _StepEnds
from attrib_agent.timeline.sched_state import SchedState, StepInput, Track
from attrib_agent.timeline.step_outcome import PreemptionSighting, ResumeSighting, StepOutcome
from attrib_agent.timeline.timeline_window import StepWindow


def _si(seq: int, end: float) -> StepInput:
    return StepInput(seq, 0, seq, end, 0.01, 0, 0, 1, 1, 0.1)


def _out(seq: int, tag: int, event: int = 0) -> StepOutcome:
    """`event` 1: the step saw a preemption, 2: a resumption."""
    pre = (PreemptionSighting("p", seq, seq, float(seq), False, 1, 1),) if event == 1 else ()
    res = (ResumeSighting("p", seq, seq, float(seq), 1),) if event == 2 else ()
    return StepOutcome(StepRecord(0, seq, float(seq), 0.01, 0, 0, 1, 1, 0.1, membership_error=tag), (), pre, res)


def _walk(w: StepWindow, inferred: dict[int, StepOutcome]) -> list[tuple[StepInput, StepOutcome]]:
    """Every step held with the outcome last inferred for it (`inferred`: by seq, all the test set)."""
    return [(w.input(q), inferred[q]) for q in range(w.first_seq, w.next_seq) if q in inferred]


def test_outcomes_and_eventful_steps_follow_inference_rewinds_and_drops() -> None:
    rng = random.Random(7)
    w = StepWindow(max_steps=400, checkpoint_every=4)
    tag = 0
    inferred: dict[int, StepOutcome] = {}
    for _ in range(300):
        op = rng.random()
        if op < 0.5:
            w.append(_si(w.next_seq, float(w.next_seq)))
        elif op < 0.8:  # infer up to the end, as refresh does
            while w.computed_to < w.next_seq:
                seq = w.computed_to
                if w.is_checkpoint(seq):
                    w.set_checkpoint(seq, SchedState(), tag)
                tag += 1
                inferred[seq] = _out(seq, tag, rng.choice((0, 0, 0, 1, 2)))
                w.set_outcome(w.input(seq), inferred[seq])
                w.computed_to += 1
        elif op < 0.9 and w.computed_to > w.first_seq:
            w.rewind(rng.randrange(w.first_seq, w.computed_to))
        else:
            upto = w.evictable(rng.uniform(w.first_seq, w.next_seq + 1))
            if upto is not None and upto > w.first_seq:
                w.drop_before(upto)
        walk = _walk(w, inferred)
        assert w.outcomes() == walk
        assert w.eventful() == [k for k, (_, o) in enumerate(walk) if o.preemptions or o.resumes]
        checkpoints = [q for q in range(w.first_seq, w.next_seq) if w.checkpoint(q) is not None]
        assert w.checkpoints() == len(checkpoints)
        assert w.oldest_clock() == min((c[1] for q in checkpoints if (c := w.checkpoint(q))), default=None)
        if checkpoints:
            q = rng.randrange(w.first_seq, w.next_seq)
            assert w.checkpoint_at_or_before(q) == max(c for c in checkpoints if c <= q)
    assert w.outcomes() is not w.outcomes()  # a copy each call: callers may keep or change theirs


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), max_size=30), st.integers(-2, 42), st.integers(-2, 42), st.booleans())
def test_step_ends_count_as_the_walk_does(ms: list[int], lo: int, hi: int, ordered: bool) -> None:
    ends = sorted(ms) if ordered else ms
    steps = [(_si(i, m / 1000.0), _out(i, 0)) for i, m in enumerate(ends)]
    walk = sum(1 for si, _ in steps if lo < si.end_ms <= hi)
    assert _StepEnds(steps).between(lo, hi) == walk
    if ordered:
        assert _StepEnds(steps, in_order=True).between(lo, hi) == walk
        # the timeline's kept list of end_ms: longer than the steps inferred (only their prefix counts)
        kept = [si.end_ms for si, _ in steps] + [max(ends, default=0) + 1, 10**6]
        assert _StepEnds(steps, in_order=True, end_ms=kept).between(lo, hi) == walk


def test_a_checkpoint_copies_every_field_of_a_track() -> None:
    """Track.clone lists the fields by hand (dataclasses.replace is slower): a field it misses fails here."""
    t = Track("r", 1.5, 3)
    for i, f in enumerate(fields(Track)):
        value = getattr(t, f.name)
        new: object = (i + 7,) if isinstance(value, tuple) else (not value) if isinstance(value, bool) else \
            f"x{i}" if isinstance(value, str) else i + 0.5 if isinstance(value, float) else i + 7
        try:
            setattr(t, f.name, new)
        except TypeError:  # a compiled Track checks the type: a None that is a `str | None` takes a string
            setattr(t, f.name, f"x{i}")
    c = t.clone()
    assert c is not t and c.key() == t.key()
    assert all(getattr(c, f.name) == getattr(t, f.name) for f in fields(Track))
    st_ = SchedState(running=[t], waiting=[Track("w", 2.0, 4)], cursor=(2.0, 4), budget=9)
    assert st_.copy().same_as(st_) and st_.copy().running[0] is not t


def test_step_input_derives_what_the_inference_reads() -> None:
    si = StepInput(0, 0, 1, 10.0004, 0.5, 2, 30, 3, 3, 0.5)
    assert (si.start_ts, si.end_ms, si.scheduled_tokens) == (10.0004 - 0.5, 10000, 33)
    assert si == StepInput(0, 0, 1, 10.0004, 0.5, 2, 30, 3, 3, 0.5) and "end_ms" not in repr(si)


def test_a_restart_is_held_while_its_step_is() -> None:
    """`holds_restart` says whether a step held follows an iteration going back; it goes with that step."""
    w = StepWindow(max_steps=8, checkpoint_every=2)
    for seq, it in enumerate([10, 11, 12, 1, 2, 3]):
        w.append(StepInput(seq, 0, it, 1.0 + seq, 0.01, 0, 0, 1, 1, 0.1))
        assert w.holds_restart() == (seq >= 3)
    w.drop_before(3)
    assert w.holds_restart()
    w.drop_before(4)
    assert not w.holds_restart()
    w.append(StepInput(6, 0, 4, 7.0, 0.01, 0, 0, 1, 1, 0.1))
    assert not w.holds_restart()
