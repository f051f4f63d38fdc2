"""The API's collector passes (agent/gc_freeze.py): survivors frozen, cycles freed before they could be frozen,
and everything unfrozen and collected once a full period."""

from __future__ import annotations

import gc
import weakref

from attrib_agent.agent.gc_freeze import GcFreezer


class _Node:
    def __init__(self) -> None:
        self.me = self  # a cycle: only the cyclic collector frees it


def test_survivors_are_frozen_and_cycles_collected_first() -> None:
    now = [0.0]
    f = GcFreezer(every_s=30.0, full_every_s=3600.0, clock=lambda: now[0])
    try:
        kept = [_Node() for _ in range(10)]
        dropped = _Node()
        gone = weakref.ref(dropped)
        del dropped
        f.start()
        assert gone() is None  # collected, not frozen
        frozen = gc.get_freeze_count()
        assert frozen >= len(kept)
        now[0] = 10.0
        assert not f.tick()  # not due yet
        later = [_Node() for _ in range(1000)]
        now[0] = 30.0
        assert f.tick() and gc.get_freeze_count() >= frozen + len(later)
        frozen_late = _Node()
        late_ref = weakref.ref(frozen_late)
        now[0] = 60.0
        assert f.tick()
        del frozen_late  # a cycle that formed garbage after it was frozen: freed by the next full pass
        now[0] = 3600.0
        assert f.tick() and late_ref() is None
        assert len(f.pauses_s) == 4
        for i in range(200):
            now[0] = 3600.0 + 30.0 * (i + 1)
            f.tick()
        assert len(f.pauses_s) == GcFreezer.MAX_PAUSES  # bounded
    finally:
        gc.unfreeze()


def test_by_default_what_survived_a_second_is_frozen_at_the_next_tick() -> None:
    """The serve loop ticks every second; with the defaults each tick collects and freezes what arrived since, so
    neither the pass nor an automatic full collection between two ticks walks more than a second of arrivals."""
    now = [0.0]
    f = GcFreezer(clock=lambda: now[0])
    try:
        f.start()
        frozen = gc.get_freeze_count()
        arrived = [_Node() for _ in range(500)]
        now[0] = 1.0
        assert f.tick() and gc.get_freeze_count() >= frozen + len(arrived)
        assert not any(o is arrived[0] for o in gc.get_objects())  # frozen objects are no longer walked
    finally:
        gc.unfreeze()
