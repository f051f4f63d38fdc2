"""Garbage-collector pauses off the API's tail: what survives is frozen, so full collections walk only what is new.

A full collection walks every tracked object: at 100,000 stored results (~0.5-1 M objects) that is a 300-700 ms
pause of the event loop the API answers on (docs/performance.md section 8). The store's results are acyclic
(reference counting frees them on eviction), so the cyclic collector gains nothing by walking them again and
again. Every `every_s`, the objects made since the last freeze are collected once (cycles among them are freed
first, never frozen) and the survivors frozen: that pause is proportional to what arrived in `every_s`, and so
is every automatic full collection in between (they walk all that is not frozen). Fed at GPU rates (~13,000
surviving objects a second), a 30 s period let both reach 270-320 ms; every second, 35-63 ms and 43 % less CPU
in the collector in all (benchmarks/gc_pauses.py). Once every `full_every_s`, everything is unfrozen and
collected: the bound on cycles that form among frozen objects after they were frozen (e.g. a connection's
objects, frozen while it was open), one full pause an hour.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

FREEZE_EVERY_S: Final = 1.0  # the serve loop ticks every second: a pass at each tick
FULL_EVERY_S: Final = 3600.0


@dataclass
class GcFreezer:
    every_s: float = FREEZE_EVERY_S
    full_every_s: float = FULL_EVERY_S
    clock: Callable[[], float] = time.monotonic
    pauses_s: list[float] = field(default_factory=list)  # the last few passes' wall time (bounded)
    _next: float | None = None
    _next_full: float | None = None

    MAX_PAUSES: Final = 64

    def start(self) -> None:
        """Collect and freeze what exists now (the store restored from the journal, modules, parser tables)."""
        now = self.clock()
        self._pass(full=True)
        self._next, self._next_full = now + self.every_s, now + self.full_every_s

    def tick(self) -> bool:
        """Run a pass if one is due; True when it ran. Call it from the loop every second or so."""
        now = self.clock()
        if self._next is None or self._next_full is None:
            self.start()
            return True
        if now < self._next:
            return False
        full = now >= self._next_full
        self._pass(full)
        self._next = now + self.every_s
        if full:
            self._next_full = now + self.full_every_s
        return True

    def _pass(self, full: bool) -> None:
        t0 = time.perf_counter()
        if full:
            gc.unfreeze()
        gc.collect()  # frozen objects are not walked: only what is new since the last pass
        gc.freeze()
        self.pauses_s.append(time.perf_counter() - t0)
        del self.pauses_s[:-self.MAX_PAUSES]
