"""Garbage-collector pauses off the API's tail: what survives is frozen, so full collections walk only what is new.

A full collection walks every tracked object: at 100,000 stored results (~0.5-1 M objects) that is a 300-700 ms
pause of the event loop the API answers on (docs/performance.md section 8). The store's results are acyclic
(reference counting frees them on eviction), so the cyclic collector gains nothing by walking them again and
again. A pass collects the objects made since the last freeze once (cycles among them are freed first, never
frozen) and freezes the survivors: its pause, and that of every automatic full collection until the next pass
(they walk all that is not frozen), is proportional to what survived since the last pass.

So a pass runs when that has grown, not on a fixed period: every `every_s` the freezer counts the survivors
(objects not frozen that lived through a young collection: the collector's generations 1 and 2, read without
walking them) and runs a pass once they reach `freeze_at`. Fed at GPU rates (10-20,000 survivors a second), a
fixed 30 s period let passes and full collections reach 270-320 ms, 1 s kept them to 35-63 ms
(benchmarks/gc_pauses.py), and 20,000 survivors doubled the longest pass (14 -> 28 ms) for half as many: 10,000
passes about every second there, as the 1 s period did. A still store, served at 200 requests/s, paid the 1 s
period with 30 passes in 30 s for the few objects that survive there. Once every `full_every_s`, everything is
unfrozen and collected: the bound on cycles that form among frozen objects after they were frozen (e.g. a
connection's objects, frozen while it was open), one full pause an hour.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Final

FREEZE_EVERY_S: Final = 1.0  # the serve loop ticks every second: survivors counted at each tick
FREEZE_AT: Final = 10_000  # survivors that make a pass due: at GPU rates about every tick, as the 1 s rule
FULL_EVERY_S: Final = 3600.0


def survivors() -> int:
    """Objects tracked and not frozen that survived a young collection (generations 1 and 2). Lists them without
    traversing them (~20 ns an object): well under a millisecond while they stay near `FREEZE_AT`."""
    return len(gc.get_objects(1)) + len(gc.get_objects(2))


@dataclass
class GcFreezer:
    every_s: float = FREEZE_EVERY_S
    freeze_at: int = FREEZE_AT  # 0: a pass at every tick
    full_every_s: float = FULL_EVERY_S
    clock: Callable[[], float] = time.monotonic
    count: Callable[[], int] = survivors
    pauses_s: list[float] = field(default_factory=list)  # the last few passes' wall time (bounded)
    frozen: list[int] = field(default_factory=list)  # the survivors that made each due (0: a full pass; bounded)
    _next: float | None = None
    _next_full: float | None = None

    MAX_PAUSES: Final = 64

    def start(self) -> None:
        """Collect and freeze what exists now (the store restored from the journal, modules, parser tables)."""
        now = self.clock()
        self._pass(True, 0)
        self._next, self._next_full = now + self.every_s, now + self.full_every_s

    def tick(self) -> bool:
        """Run a pass if one is due; True when it ran. Call it from the loop every second or so."""
        now = self.clock()
        if self._next is None or self._next_full is None:
            self.start()
            return True
        if now < self._next:
            return False
        self._next = now + self.every_s
        full = now >= self._next_full
        young = 0 if full else self.count()
        if not full and young < self.freeze_at:
            return False
        self._pass(full, young)
        if full:
            self._next_full = now + self.full_every_s
        return True

    def stop(self) -> None:
        """Unfreeze what the passes froze (a no-op if none ran): the collector walks it again, and frees the cycles
        that formed among it since. The next tick starts afresh."""
        if self._next is not None:
            gc.unfreeze()
        self._next = self._next_full = None

    def _pass(self, full: bool, young: int) -> None:
        t0 = time.perf_counter()
        if full:
            gc.unfreeze()
        gc.collect()  # frozen objects are not walked: only what is new since the last pass
        gc.freeze()
        self.pauses_s.append(time.perf_counter() - t0)
        self.frozen.append(young)
        del self.pauses_s[:-self.MAX_PAUSES], self.frozen[:-self.MAX_PAUSES]
