"""What one routing run measured, and the study's table: per load and policy, the shorts' TTFT p50/p95 and SLO
misses as the mean over seeds with their range."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from statistics import mean

from attrib_agent.lab.oracle.workload import OracleRequest
from attrib_agent.lab.routing.instance import Served
from attrib_agent.lab.routing.workload import is_long
from attrib_agent.lab.summary import percentile

TTFT_SLO_S = 5.0  # seed 002's budget for short-input requests


@dataclass(frozen=True, slots=True)
class RunResult:
    policy: str
    rate: float
    seed: int
    short_ttfts: tuple[float, ...]
    whale_ttfts: tuple[float, ...]
    whale_instances: tuple[int, ...]  # where each long request went, in arrival order
    served_on: Mapping[str, tuple[int, ...]]  # request id -> the instances that served it (exactly one each)
    unfinished: tuple[str, ...]
    api_calls: int
    fallbacks: int
    preemptions: int

    @classmethod
    def collect(cls, policy: str, rate: float, seed: int, reqs: Sequence[OracleRequest], placed: Mapping[str, int],
                served: Sequence[Mapping[str, Served]], api_calls: int, fallbacks: int, preemptions: int
                ) -> RunResult:
        on: dict[str, list[int]] = {r.request_id: [] for r in reqs}
        unfinished = []
        for i, by_id in enumerate(served):
            for rid, sv in by_id.items():
                on.setdefault(rid, []).append(i)
                if sv.finished is None or sv.output_tokens != sv.max_tokens:
                    unfinished.append(rid)

        def ttft(r: OracleRequest) -> float:
            t = served[placed[r.request_id]][r.request_id].ttft
            return float("inf") if t is None else t

        return cls(policy, rate, seed,
                   tuple(ttft(r) for r in reqs if not is_long(r)), tuple(ttft(r) for r in reqs if is_long(r)),
                   tuple(placed[r.request_id] for r in reqs if is_long(r)),
                   {rid: tuple(v) for rid, v in on.items()}, tuple(unfinished), api_calls, fallbacks, preemptions)

    @property
    def p50(self) -> float:
        return percentile(self.short_ttfts, 50)

    @property
    def p95(self) -> float:
        return percentile(self.short_ttfts, 95)

    @property
    def misses(self) -> int:
        return sum(t > TTFT_SLO_S for t in self.short_ttfts)

    def as_dict(self) -> dict[str, object]:
        return {"policy": self.policy, "rate": self.rate, "seed": self.seed, "shorts_ttft_p50_s": self.p50,
                "shorts_ttft_p95_s": self.p95, "shorts_over_slo": self.misses, "short_ttfts_s": self.short_ttfts,
                "whale_ttfts_s": self.whale_ttfts, "whale_instances": self.whale_instances,
                "served_on": dict(self.served_on), "unfinished": self.unfinished, "api_calls": self.api_calls,
                "fallbacks": self.fallbacks, "preemptions": self.preemptions}

    def line(self) -> str:
        return (f"rate={self.rate:g}/s seed={self.seed} {self.policy:>12}: shorts {len(self.short_ttfts)} "
                f"TTFT p50 {self.p50:.2f} s p95 {self.p95:.2f} s, > {TTFT_SLO_S:g} s: {self.misses}; "
                f"whales on {''.join('AB'[i] for i in self.whale_instances)}, TTFT p50 "
                f"{percentile(self.whale_ttfts, 50):.2f} s; preemptions {self.preemptions}; "
                f"API calls {self.api_calls} (fallbacks {self.fallbacks})")


def _cell(values: Sequence[float], fmt: str) -> str:
    return f"{format(mean(values), fmt)} ({format(min(values), fmt)}-{format(max(values), fmt)})"


def format_table(results: Sequence[RunResult]) -> str:
    """Markdown: a row per (load, policy), each figure the mean over seeds with its min-max."""
    head = ("| shorts/s | policy | seeds | shorts TTFT p50, s | shorts TTFT p95, s | shorts > 5 s, % "
            "| whales TTFT p50, s | preemptions |\n| ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: |")
    rows = [head]
    keys = sorted({(r.rate, r.policy) for r in results}, key=lambda k: (k[0], _ORDER.get(k[1], 9)))
    for rate, policy in keys:
        rs = [r for r in results if (r.rate, r.policy) == (rate, policy)]
        rows.append(f"| {rate:g} | {policy} | {len(rs)} | {_cell([r.p50 for r in rs], '.2f')} "
                    f"| {_cell([r.p95 for r in rs], '.2f')} "
                    f"| {_cell([100 * r.misses / len(r.short_ttfts) for r in rs], '.1f')} "
                    f"| {_cell([percentile(r.whale_ttfts, 50) for r in rs], '.2f')} "
                    f"| {_cell([float(r.preemptions) for r in rs], '.0f')} |")
    return "\n".join(rows)


_ORDER = {"round-robin": 0, "least-loaded": 1, "forecast": 2, "forecast+least-loaded": 3}
