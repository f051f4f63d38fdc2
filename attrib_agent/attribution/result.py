"""What the attribution engine says about one finished request, and the bounded store that keeps it.

The parts add up: for TTFT, sum(culprit.ttft_s) + unexplained_ttft_s == ttft_slowdown_s (likewise ITL),
and no part is negative. Ids only, no request content.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final

from attrib_agent.attribution.culprit_windows import CulpritWindows

CAUSES: Final = ("kv_pressure", "head_of_line", "prefill_contention", "decode_batching", "kv_bandwidth", "preemption")
NO_CAUSES: Final[Mapping[str, float]] = {}
"""The causes of a culprit with none (two thirds of them): one shared empty dict instead of 64 bytes each,
100,000 results over. Read-only like every result's causes; a plain dict so asdict/json take it as one."""


@dataclass(frozen=True, slots=True)
class Culprit:
    request_id: str
    ttft_s: float  # seconds of the victim's TTFT blamed on this request
    itl_s: float  # seconds per token of the victim's mean ITL blamed on it
    share: float  # of the victim's total blamed TTFT + ITL seconds (0..1)
    causes: Mapping[str, float] = field(default_factory=dict)  # TTFT seconds by cause
    kv_block_seconds: float = 0.0  # KV block-seconds it held while the victim was in flight
    is_whale: bool = False


@dataclass(frozen=True, slots=True)
class AttributionResult:
    request_id: str
    finished_ts: float
    ttft_s: float | None
    ttft_baseline_s: float | None
    ttft_slowdown_s: float
    itl_s: float | None  # observed mean inter-token latency
    itl_baseline_s: float | None
    itl_slowdown_s: float
    culprits: tuple[Culprit, ...]
    unexplained_ttft_s: float
    unexplained_itl_s: float
    no_interference: bool  # slowdowns below the noise floor
    quality: float  # 0..1: how well the reconstruction explained what vLLM reported
    is_whale: bool = False
    engine: int = 0
    arrival_ts: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    trace_id: str | None = None  # vLLM's `llm_request` span (32 hex), set by the pipeline when the span landed
    span_id: str | None = None  # (16 hex)
    final: bool = True  # False while requests that overlapped this one are still running (may be refined)

    @property
    def itl_gaps(self) -> int:
        """Gaps between output tokens: a per-token ITL figure times this is seconds of decode time."""
        return max((self.completion_tokens or 1) - 1, 0)

    def culprit(self, request_id: str) -> Culprit | None:
        return next((c for c in self.culprits if c.request_id == request_id), None)

    def top_culprit(self) -> Culprit | None:
        return max(self.culprits, key=lambda c: (c.ttft_s + c.itl_s, c.request_id), default=None)


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
