"""The bounded store of attribution results, and the culprit index it keeps over them."""

from __future__ import annotations

import sys
from collections import OrderedDict
from collections.abc import Iterator
from typing import Final

from attrib_agent.attribution.culprit_windows import CulpritWindows
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_pack import Stored, decoded, finished_ts, pack, stored_bytes

DEFAULT_MAX_BYTES: Final = 40 * 2**20
ENTRY_BYTES: Final = 160
"""What one result's entries cost besides its bytes and its id, in CPython 3.11's maps: the store's ordered map
(a dict slot and index at 2/3 load, ~45 bytes, and a linked node with its fast-lookup slot, ~56) and the
culprit index's bucket map (~45). `benchmarks.memory --part results` prints the counted bytes beside RSS."""


class ResultStore:
    """Results of finished requests, bounded by count, by bytes and by age (oldest dropped first). Each is kept
    packed (result_pack.py: one bytes, ~0.7 KB at GPU rates where the objects took ~2.1 KB) and decoded when
    read, so `get` and iteration return new objects equal to what was put. Every result in it is also filed in
    `culprits`, the index `/v1/culprits/top` reads instead of the whole store."""

    def __init__(self, max_results: int = 100_000, max_age_s: float = 3600.0,
                 max_bytes: int = DEFAULT_MAX_BYTES) -> None:
        if max_results < 1 or max_age_s <= 0 or max_bytes < 1:
            raise ValueError("max_results and max_bytes must be >= 1 and max_age_s > 0")
        self.max_results = max_results
        self.max_age_s = max_age_s
        self.max_bytes = max_bytes
        self._items: OrderedDict[str, Stored] = OrderedDict()
        self.culprits = CulpritWindows()
        self.evicted = 0
        self.bytes = 0  # what the results held cost, as `cost` counts it

    @staticmethod
    def cost(request_id: str, v: Stored) -> int:
        """Bytes a stored result counts against max_bytes: its packed bytes (or objects), its id, its entries."""
        return stored_bytes(v) + sys.getsizeof(request_id) + ENTRY_BYTES

    def put(self, result: AttributionResult) -> None:
        rid = result.request_id
        old = self._items.pop(rid, None)
        if old is not None:
            self._forget(rid, old)
        packed = pack(result)
        v: Stored = packed if packed is not None else result
        self._items[rid] = v
        self.bytes += self.cost(rid, v)
        self.culprits.add(rid, v, result)
        while len(self._items) > self.max_results or self.bytes > self.max_bytes:
            self._forget(*self._items.popitem(last=False))
            self.evicted += 1

    def _forget(self, request_id: str, v: Stored) -> None:
        """Take a result that left `_items` out of the index and the byte count."""
        self.culprits.remove(request_id, v)
        self.bytes -= self.cost(request_id, v)

    def get(self, request_id: str) -> AttributionResult | None:
        v = self._items.get(request_id)
        return None if v is None else decoded(request_id, v)

    def expire(self, now: float) -> int:
        """Drop results that finished more than max_age_s before `now` (the caller's clock)."""
        n = 0
        while self._items:
            first = next(iter(self._items.values()))
            if now - finished_ts(first) <= self.max_age_s:
                break
            self._forget(*self._items.popitem(last=False))
            n += 1
        self.evicted += n
        return n

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[AttributionResult]:
        """The results oldest first, each decoded as it is reached (from a copy of the entries taken now)."""
        return (decoded(rid, v) for rid, v in list(self._items.items()))
