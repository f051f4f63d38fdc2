"""KV block ledger: who holds how many KV blocks after each step, checked against what vLLM reports.

A request holds ceil(tokens in its KV / block_size) blocks (prompt tokens computed so far plus tokens
generated, prefix hits included) from the step that allocates them until it finishes, is aborted or is
preempted. A prefix hit's blocks are the copy another request holds: they are counted once, as shared
blocks, and a request's own figure is its *exclusive* blocks, what removing it alone would free (kv_share.py).
Exclusive plus shared blocks predict vLLM's `kv_cache_usage_perc`; the difference (the residual, in blocks)
is model error. vLLM's usage is used / (num_gpu_blocks - 1): block 0 is its reserved null block.
Block-seconds per request (of its exclusive blocks) give the memory-fair view of who used the pool. A step's
holdings are what it leaves held (a request finishing in it is gone), so nothing is counted over the engine's idle
time: the last busy step leaves nothing. They stand for the next step's duration too, so a request's admitting
step is not counted (both modes; on preempt-steps a short admitted into a 0.9 s step shows 55 % of what vLLM's
steps give it, the whales 93-94 %).
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from attrib_agent.timeline.kv_share import KvSplit
from attrib_agent.timeline.sched_state import Geometry, StepInput
from attrib_agent.timeline.step_outcome import StepOutcome

SCRAPE_WINDOW_S = 0.1  # how long before its receipt a /metrics body may have been rendered (fetch time bound)


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """What the timeline keeps of one /metrics scrape."""

    ts: float
    kv_usage: float | None
    preemptions_total: float | None
    counter_reset: bool = False


@dataclass(frozen=True, slots=True)
class KvReconciliation:
    """Predicted blocks in use against vLLM's own figure at one moment (a step line or a metrics sample)."""

    ts: float
    iteration: int | None  # the step whose state is compared
    observed_blocks: float  # kv_usage x usable blocks
    predicted_blocks: int

    @property
    def residual(self) -> float:
        return self.observed_blocks - self.predicted_blocks


@dataclass(frozen=True, slots=True)
class RequestKv:
    """One request's use of the KV pool over its life (as far as the timeline still holds it)."""

    request_id: str
    block_seconds: float  # of its exclusive blocks (shared prefix blocks are nobody's alone)
    peak_blocks: int  # blocks it referenced at most, shared ones included
    start_ts: float
    end_ts: float
    mean_share: float  # block-seconds / (usable blocks x life): its average share of the pool


@dataclass(frozen=True, slots=True)
class ResidualStats:
    n: int
    median_abs: float
    p95_abs: float
    max_abs: float


def residual_stats(recs: Sequence[KvReconciliation]) -> ResidualStats:
    values = sorted(abs(r.residual) for r in recs)
    if not values:
        return ResidualStats(0, 0.0, 0.0, 0.0)
    p95 = values[min(len(values) - 1, math.ceil(0.95 * len(values)) - 1)]
    return ResidualStats(len(values), values[len(values) // 2], p95, values[-1])


class KvBlockLedger:
    """Built from the timeline's steps (in order), its metrics samples and the requests' lifetimes."""

    def __init__(self, geometry: Geometry, steps: Sequence[tuple[StepInput, StepOutcome]],
                 samples: Sequence[MetricsSample], lifetimes: Mapping[str, tuple[float | None, float | None]]) -> None:
        self.geometry = geometry
        self._steps = list(steps)
        self._samples = list(samples)
        self._ends = [si.end_ts for si, _ in self._steps]
        self._requests = self._integrate(lifetimes)

    def blocks(self, request_id: str, iteration: int) -> int:
        """Blocks the request held after the step with this iteration number (0 if it held none)."""
        for si, out in self._steps:
            if si.iteration == iteration:
                return dict(out.holdings).get(request_id, 0)
        return 0

    def held_at(self, ts: float) -> dict[str, int]:
        """Blocks per request in force at `ts`: as left by the last step that ended by then."""
        i = _last_at_or_before(self._ends, ts)
        return {} if i is None else dict(self._steps[i][1].holdings)

    def split_at(self, ts: float) -> KvSplit:
        """Exclusive blocks per request and the shared blocks in force at `ts` (each physical block once)."""
        i = _last_at_or_before(self._ends, ts)
        return KvSplit((), 0) if i is None else self._steps[i][1].kv_split()

    def step_reconciliations(self) -> list[KvReconciliation]:
        """At every step line: predicted blocks against the line's own KV usage."""
        return [KvReconciliation(si.end_ts, si.iteration, out.observed_blocks, out.predicted_blocks)
                for si, out in self._steps if out.observed_blocks is not None and out.predicted_blocks is not None]

    def reconciliations(self) -> list[KvReconciliation]:
        """At every metrics sample with a KV figure: the step whose state the gauge showed, and the residual.

        The gauge is set when a step's output is processed, and the scrape renders it at some moment before
        its receipt time: the state shown is that of the last step before the scrape, or of one that was
        current within SCRAPE_WINDOW_S before it; the one whose logged usage matches the sample is taken.
        """
        return [r for sample in self._samples
                if (r := reconcile(self.geometry, self._steps, self._ends, sample)) is not None]

    def request(self, request_id: str) -> RequestKv | None:
        return self._requests.get(request_id)

    def requests(self) -> list[RequestKv]:
        return sorted(self._requests.values(), key=lambda r: (r.start_ts, r.request_id))

    def _integrate(self, lifetimes: Mapping[str, tuple[float | None, float | None]]) -> dict[str, RequestKv]:
        """Holdings are piecewise constant between step ends: each step's holdings last until the next step."""
        seconds: dict[str, float] = {}
        peak: dict[str, int] = {}
        first_seen: dict[str, float] = {}
        last_seen: dict[str, float] = {}
        for k, (si, out) in enumerate(self._steps):
            span = self._ends[k + 1] - si.end_ts if k + 1 < len(self._steps) else 0.0
            for rid, blocks in own_blocks(out):
                seconds[rid] = seconds.get(rid, 0.0) + blocks * max(span, 0.0)
            for rid, blocks in out.holdings:
                peak[rid] = max(peak.get(rid, 0), blocks)
                first_seen.setdefault(rid, si.start_ts)
                last_seen[rid] = si.end_ts + max(span, 0.0)
        usable = self.geometry.usable_blocks
        result: dict[str, RequestKv] = {}
        for rid, bs in seconds.items():
            start, end = lifetimes.get(rid, (None, None))
            start = first_seen[rid] if start is None else min(start, first_seen[rid])
            end = last_seen[rid] if end is None else end
            life = end - start
            share = bs / (usable * life) if usable and life > 0 else 0.0
            result[rid] = RequestKv(rid, bs, peak[rid], start, end, share)
        return result


def block_seconds(steps: Sequence[tuple[StepInput, StepOutcome]], request_ids: Iterable[str], lo: int = 0,
                  hi: int | None = None) -> dict[str, float]:
    """`KvBlockLedger(...).request(rid).block_seconds` of just these requests (those holding none: absent), the
    same sums in the same order, without building the ledger: an attribution pass names a few culprits, the
    ledger integrates every request the window holds (a pass's largest fixed cost at GPU rates). `steps[lo:hi]`:
    where the caller knows they hold blocks (none of them in a step outside it)."""
    want = set(request_ids)
    seconds: dict[str, float] = {}
    last = len(steps) - 1
    for k in range(lo, len(steps) if hi is None else min(hi, len(steps))):
        si, out = steps[k]
        span = steps[k + 1][0].end_ts - si.end_ts if k < last else 0.0
        for rid, blocks in own_blocks(out):
            if rid in want:
                seconds[rid] = seconds.get(rid, 0.0) + blocks * max(span, 0.0)
    return seconds


def own_blocks(out: StepOutcome) -> Sequence[tuple[str, int]]:
    """Each request's exclusive blocks after the step (its holdings where no prefix is shared: no split built)."""
    return out.kv_split().exclusive if out.prefix_shares else out.holdings


def reconcile(geometry: Geometry, steps: Sequence[tuple[StepInput, StepOutcome]], ends: Sequence[float],
              sample: MetricsSample) -> KvReconciliation | None:
    """One metrics sample against the step whose state its KV gauge showed (`KvBlockLedger.reconciliations`)."""
    usable = geometry.usable_blocks
    if usable is None or geometry.block_size is None:
        return None
    i = _last_at_or_before(ends, sample.ts)
    if sample.kv_usage is None or i is None:
        return None
    observed = sample.kv_usage * usable
    candidates = [i]  # steps whose state may have been current while the scrape was served
    while candidates[-1] > 0 and ends[candidates[-1]] >= sample.ts - SCRAPE_WINDOW_S:
        candidates.append(candidates[-1] - 1)
    j = min(candidates, key=lambda j: (abs(_obs(steps[j][1]) - observed), candidates.index(j)))
    si, step_out = steps[j]
    if step_out.predicted_blocks is None:
        return None
    return KvReconciliation(sample.ts, si.iteration, observed, step_out.predicted_blocks)


@dataclass(frozen=True, slots=True)
class KvLatest:
    """The ledger's latest figures without building the ledger (what a scrape needs, at the cost of a few steps
    read from the end): the last step's reconciliation, the holdings in force at its end, the last sample's."""

    step: KvReconciliation | None  # step_reconciliations()[-1]
    held: dict[str, int]  # held_at(step.ts)
    sample: KvReconciliation | None  # reconciliations()[-1]


def kv_latest(geometry: Geometry, steps: Sequence[tuple[StepInput, StepOutcome]],
              samples: Sequence[MetricsSample], ends: Sequence[float] | None = None) -> KvLatest:
    """What `KvBlockLedger(...).step_reconciliations()[-1]`, `held_at` of its time and `reconciliations()[-1]`
    give, reading backwards from the latest step and sample until each is found (steps end in order). `ends`:
    the steps' ends when the caller keeps them (a scrape's read, not a walk of every step held)."""
    step = None
    for si, out in reversed(steps):
        if out.observed_blocks is not None and out.predicted_blocks is not None:
            step = KvReconciliation(si.end_ts, si.iteration, out.observed_blocks, out.predicted_blocks)
            break
    held: dict[str, int] = {}
    if step is not None:
        i = len(steps) - 1
        while i > 0 and steps[i][0].end_ts > step.ts:
            i -= 1
        held = dict(steps[i][1].holdings)
    last = None
    if samples:
        ends = [si.end_ts for si, _ in steps] if ends is None else ends
        for sample in reversed(samples):
            if (last := reconcile(geometry, steps, ends, sample)) is not None:
                break
    return KvLatest(step, held, last)


def _obs(out: StepOutcome) -> float:
    return out.observed_blocks if out.observed_blocks is not None else float("inf")


def _last_at_or_before(ends: Sequence[float], ts: float) -> int | None:
    i = bisect.bisect_right(ends, ts) - 1
    return i if i >= 0 else None
