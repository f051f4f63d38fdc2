"""Running totals of final attribution results, for the Prometheus collector (pure, bounded by label sets).

Only final results are counted, once each: a partial result (culprits still running) is refined later and
counted when it becomes final, so counters never count a victim twice. Label sets are closed (phase x
victim class x culprit class x cause), so the series count is bounded whatever the traffic.
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Final

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.slo import SloTally

SLOWDOWN_BUCKETS_S: Final = (0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
PHASES: Final = ("ttft", "itl")


def victim_class(result: AttributionResult) -> str:
    return "whale" if result.is_whale else "short"


def phase_slowdowns(ttft_slowdown_s: float, itl_slowdown_s: float, gaps: int) -> tuple[tuple[str, float], ...]:
    """A request's slowdown in each phase, in seconds of its own time: TTFT's, and the per-token ITL's over its
    token gaps."""
    return ("ttft", ttft_slowdown_s), ("itl", itl_slowdown_s * gaps)


def slowed(phase_s: float, victim_threshold_s: float) -> bool:
    """The rule that makes a request a slowed victim in a phase (`attrib_slowed_requests_total`), and while the
    agent sheds, one attributed whatever the share (the pipeline's `visible_slowdown`): shared, never restated."""
    return phase_s >= victim_threshold_s


@dataclass(frozen=True, slots=True)
class Exemplar:
    trace_id: str
    value: float
    ts: float


@dataclass
class SlowdownHistogram:
    """Cumulative-bucket histogram with the latest exemplar per bucket (Prometheus/OpenMetrics shape)."""

    buckets: tuple[float, ...] = SLOWDOWN_BUCKETS_S
    counts: list[int] = field(default_factory=list)  # per bucket, not cumulative; last is +Inf
    total: float = 0.0
    exemplars: dict[int, Exemplar] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not self.counts:
            self.counts = [0] * (len(self.buckets) + 1)

    def observe(self, value: float, exemplar: Exemplar | None = None) -> None:
        i = bisect.bisect_left(self.buckets, value)
        self.counts[i] += 1
        self.total += value
        if exemplar is not None:
            self.exemplars[i] = exemplar

    @property
    def count(self) -> int:
        return sum(self.counts)

    def cumulative(self) -> list[tuple[str, int, Exemplar | None]]:
        """(le, cumulative count, exemplar) rows, `+Inf` last."""
        rows: list[tuple[str, int, Exemplar | None]] = []
        acc = 0
        for i, n in enumerate(self.counts):
            acc += n
            le = "+Inf" if i == len(self.buckets) else repr(float(self.buckets[i]))
            rows.append((le, acc, self.exemplars.get(i)))
        return rows


@dataclass
class SlowdownTally:
    """Totals over every final result seen: what the `attrib_*slowdown*` series report."""

    victim_threshold_s: float = 0.1
    # (phase, victim class, culprit class, cause) -> seconds
    attributed_s: defaultdict[tuple[str, str, str, str], float] = field(default_factory=lambda: defaultdict(float))
    unexplained_s: defaultdict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))
    requests: Counter[str] = field(default_factory=Counter)  # victim class
    slowed: Counter[tuple[str, str]] = field(default_factory=Counter)  # phase, victim class
    histograms: dict[tuple[str, str], SlowdownHistogram] = field(default_factory=dict)  # phase, victim class
    slo: SloTally = field(default_factory=SloTally)  # goodput by traffic shape, from the same final results

    def add(self, r: AttributionResult) -> None:
        if not r.final:
            raise ValueError("only final results are tallied")
        vc = victim_class(r)
        gaps = r.itl_gaps
        self.requests[vc] += 1
        self.slo.add(r)
        phases = phase_slowdowns(r.ttft_slowdown_s, r.itl_slowdown_s, gaps)
        for (phase, slow), unexplained in zip(phases, (r.unexplained_ttft_s, r.unexplained_itl_s * gaps),
                                              strict=True):
            if slowed(slow, self.victim_threshold_s):
                self.slowed[(phase, vc)] += 1
            self.unexplained_s[(phase, vc)] += unexplained
            ex = Exemplar(r.trace_id, slow, r.finished_ts) if r.trace_id and slow > 0 else None
            self.histograms.setdefault((phase, vc), SlowdownHistogram()).observe(slow, ex)
        for c in r.culprits:
            cc = "whale" if c.is_whale else "crowd"
            for phase, by_cause in (("ttft", c.ttft_by_cause()), ("itl", c.itl_by_cause(gaps))):
                for cause, secs in by_cause.items():
                    self.attributed_s[(phase, vc, cc, cause)] += secs
