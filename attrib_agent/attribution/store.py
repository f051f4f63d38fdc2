"""The bounded store of attribution results, and the culprit index it keeps over them."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from attrib_agent.attribution.culprit_windows import CulpritWindows
from attrib_agent.attribution.result import AttributionResult


class ResultStore:
    """Results of finished requests, bounded by count and by age (oldest dropped first). Every result in it is
    also filed in `culprits`, the index `/v1/culprits/top` reads instead of the whole store."""

    def __init__(self, max_results: int = 100_000, max_age_s: float = 3600.0) -> None:
        if max_results < 1 or max_age_s <= 0:
            raise ValueError("max_results must be >= 1 and max_age_s > 0")
        self.max_results = max_results
        self.max_age_s = max_age_s
        self._items: OrderedDict[str, AttributionResult] = OrderedDict()
        self.culprits = CulpritWindows()
        self.evicted = 0

    def put(self, result: AttributionResult) -> None:
        old = self._items.pop(result.request_id, None)
        if old is not None:
            self.culprits.remove(old)
        self._items[result.request_id] = result
        self.culprits.add(result)
        while len(self._items) > self.max_results:
            self.culprits.remove(self._items.popitem(last=False)[1])
            self.evicted += 1

    def get(self, request_id: str) -> AttributionResult | None:
        return self._items.get(request_id)

    def expire(self, now: float) -> int:
        """Drop results that finished more than max_age_s before `now` (the caller's clock)."""
        n = 0
        while self._items:
            first = next(iter(self._items.values()))
            if now - first.finished_ts <= self.max_age_s:
                break
            self.culprits.remove(self._items.popitem(last=False)[1])
            n += 1
        self.evicted += n
        return n

    def __len__(self) -> int:
        return len(self._items)

    def __iter__(self) -> Iterator[AttributionResult]:
        return iter(list(self._items.values()))
