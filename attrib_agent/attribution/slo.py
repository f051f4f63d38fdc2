"""Goodput by traffic shape: how many final results met their latency budgets, per shape (pure, bounded).

A request's shape comes from its prompt and output lengths (short or long input x short or long output:
siso, silo, liso, lilo), the classes one sizes a deployment by; a request whose lengths are unknown is
`unknown`. It meets the SLO when its observed TTFT is within the TTFT budget and its ITL figure (vLLM's
mean gap between output tokens) within the ITL budget. For the requests that missed, the seconds the
attribution blamed are split between whales and the ordinary crowd (and what it could not explain), which
says whether a shape's misses are the whales' doing or plain load.

Like `tally.SlowdownTally`, only final results are counted, once each; every key is in a closed set.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field
from typing import Final

from attrib_agent.attribution.result import AttributionResult

SHAPES: Final = ("siso", "silo", "liso", "lilo", "unknown")
OUTCOMES: Final = ("met", "missed_ttft", "missed_itl", "missed_both")
BLAMED_ON: Final = ("whale", "crowd", "unexplained")


@dataclass(frozen=True, slots=True)
class SloConfig:
    """Budgets and shape thresholds (settings `slo_*` and `shape_*`). A length at or above a threshold is long."""

    ttft_s: float = 5.0
    itl_s: float = 0.25
    long_prompt_tokens: int = 1024
    long_output_tokens: int = 256

    def __post_init__(self) -> None:
        if not (self.ttft_s > 0 and self.itl_s > 0 and self.long_prompt_tokens >= 1 and self.long_output_tokens >= 1):
            raise ValueError("SLO budgets must be > 0 and shape thresholds >= 1 token")


def shape_of(prompt_tokens: int | None, output_tokens: int | None, cfg: SloConfig) -> str:
    if prompt_tokens is None or output_tokens is None:
        return "unknown"
    return ("li" if prompt_tokens >= cfg.long_prompt_tokens else "si") + (
        "lo" if output_tokens >= cfg.long_output_tokens else "so")


def outcome_of(r: AttributionResult, cfg: SloConfig) -> str:
    """A missing figure cannot miss: no TTFT means no first token was timed, no ITL means one output token."""
    ttft_missed = r.ttft_s is not None and r.ttft_s > cfg.ttft_s
    itl_missed = r.itl_s is not None and r.itl_s > cfg.itl_s
    return ("missed_both" if itl_missed else "missed_ttft") if ttft_missed else (
        "missed_itl" if itl_missed else "met")


@dataclass
class SloTally:
    """Counts per (shape, outcome) and, for missed requests, blamed seconds per (shape, blamed_on)."""

    config: SloConfig = field(default_factory=SloConfig)
    requests: Counter[tuple[str, str]] = field(default_factory=Counter)
    missed_blame_s: defaultdict[tuple[str, str], float] = field(default_factory=lambda: defaultdict(float))

    def add(self, r: AttributionResult) -> None:
        if not r.final:
            raise ValueError("only final results are tallied")
        shape = shape_of(r.prompt_tokens, r.completion_tokens, self.config)
        outcome = outcome_of(r, self.config)
        self.requests[(shape, outcome)] += 1
        if outcome == "met":
            return
        gaps = r.itl_gaps
        for c in r.culprits:
            self.missed_blame_s[(shape, "whale" if c.is_whale else "crowd")] += c.ttft_s + c.itl_s * gaps
        self.missed_blame_s[(shape, "unexplained")] += r.unexplained_ttft_s + r.unexplained_itl_s * gaps
