"""Client-side latency figures of a lab run: TTFT from the intended send time, and ITL from token gaps."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


def ttft_s(r: Mapping[str, Any]) -> float | None:
    """Time to first token measured from the *intended* send (no coordinated omission)."""
    if r.get("status") != "ok" or r.get("first_token_ts") is None:
        return None
    return float(r["first_token_ts"]) - float(r["intended_send_ts"])


def mean_itl_s(r: Mapping[str, Any]) -> float | None:
    """Mean gap between consecutive tokens: (last - first) / (n - 1), as vLLM's ITL is defined."""
    toks = r.get("token_ts") or []
    if r.get("status") != "ok" or len(toks) < 2:
        return None
    return (float(toks[-1]) - float(toks[0])) / (len(toks) - 1)


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile, q in [0, 100]."""
    if not values:
        raise ValueError("no values")
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True)
class Spread:
    """Mean and spread of a figure over reps (or requests)."""

    n: int
    mean: float
    std: float
    min: float
    max: float

    @classmethod
    def of(cls, values: Iterable[float]) -> Spread:
        xs = list(values)
        if not xs:
            raise ValueError("no values")
        return cls(len(xs), statistics.fmean(xs), statistics.stdev(xs) if len(xs) > 1 else 0.0, min(xs), max(xs))

    def as_dict(self) -> dict[str, float | int]:
        return {"n": self.n, "mean": self.mean, "std": self.std, "min": self.min, "max": self.max}


@dataclass(frozen=True)
class GroupLatency:
    count: int
    ok: int
    ttft_p50_s: float | None
    ttft_p95_s: float | None
    itl_mean_s: float | None


def group_latency(results: Iterable[Mapping[str, Any]]) -> GroupLatency:
    rs = list(results)
    ttfts = [t for t in map(ttft_s, rs) if t is not None]
    itls = [t for t in map(mean_itl_s, rs) if t is not None]
    return GroupLatency(
        count=len(rs),
        ok=sum(1 for r in rs if r.get("status") == "ok"),
        ttft_p50_s=percentile(ttfts, 50) if ttfts else None,
        ttft_p95_s=percentile(ttfts, 95) if ttfts else None,
        itl_mean_s=statistics.fmean(itls) if itls else None,
    )


def shorts(results: Iterable[Mapping[str, Any]]) -> list[Mapping[str, Any]]:
    return [r for r in results if not r.get("is_whale")]


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1000:.1f}"


def format_table(rows: Sequence[tuple[str, GroupLatency]]) -> str:
    head = f"{'run':<28} {'shorts ok':>9} {'TTFT p50 ms':>11} {'TTFT p95 ms':>11} {'mean ITL ms':>11}"
    lines = [head, "-" * len(head)]
    for label, g in rows:
        lines.append(f"{label:<28} {f'{g.ok}/{g.count}':>9} {_ms(g.ttft_p50_s):>11} {_ms(g.ttft_p95_s):>11} "
                     f"{_ms(g.itl_mean_s):>11}")
    return "\n".join(lines)
