"""`/v1/culprits/top`: who caused the most slowdown lately, summed over the victims' results.

A culprit's weight is the victim seconds it cost: its TTFT blame plus its per-token ITL blame times the
victim's token gaps, the same seconds the `attrib_attributed_slowdown_seconds_total` counter adds up. Causes
are split the way that counter splits them (ITL blame under `decode_batching`, blame without a traced
mechanism under `other`), so a culprit's causes sum to its seconds.
"""

from __future__ import annotations

import math
import re
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

from attrib_agent.attribution.result import AttributionResult

MAX_WINDOW_S: Final = 30 * 86400.0
MAX_LIMIT: Final = 1000
_UNIT_S: Final = {"y": 365 * 86400.0, "w": 7 * 86400.0, "d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0, "ms": 0.001}
# Prometheus durations: units largest first, each at most once (`1h30m`, `90s`, `500ms`).
_DURATION_RE: Final = re.compile(r"(?:(\d+)y)?(?:(\d+)w)?(?:(\d+)d)?(?:(\d+)h)?(?:(\d+)m)?(?:(\d+)s)?(?:(\d+)ms)?")


class BadQuery(ValueError):
    """A query parameter the API cannot use; the message says what is accepted."""


def parse_duration(text: str) -> float:
    """Seconds in a Prometheus-style duration (`30s`, `5m`, `1h30m`, `500ms`) or a plain number of seconds."""
    text = text.strip()
    m = _DURATION_RE.fullmatch(text)
    if text and m is not None and any(m.groups()):
        seconds = sum(int(g) * unit for g, unit in zip(m.groups(), _UNIT_S.values(), strict=True) if g)
    else:
        try:
            seconds = float(text)
        except ValueError:
            raise BadQuery(f"window must be a duration like 30s, 5m or 1h (got {text[:40]!r})") from None
    if not math.isfinite(seconds) or seconds <= 0 or seconds > MAX_WINDOW_S:
        raise BadQuery(f"window must be more than 0 and at most {int(MAX_WINDOW_S)}s")
    return seconds


def parse_limit(text: str | None, default: int = 10) -> int:
    if text is None:
        return default
    try:
        n = int(text)
    except ValueError:
        raise BadQuery(f"limit must be an integer from 1 to {MAX_LIMIT}") from None
    if not 1 <= n <= MAX_LIMIT:
        raise BadQuery(f"limit must be an integer from 1 to {MAX_LIMIT}")
    return n


def victim_seconds(r: AttributionResult) -> float:
    """The victim's slowdown in seconds of its own time: TTFT plus per-token ITL times its token gaps."""
    return r.ttft_slowdown_s + r.itl_slowdown_s * r.itl_gaps


@dataclass
class CulpritTotal:
    request_id: str
    seconds: float = 0.0
    ttft_s: float = 0.0
    itl_s: float = 0.0  # per-token ITL blame times each victim's gaps: seconds
    is_whale: bool = False
    victims: set[str] = field(default_factory=set)
    causes: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))

    def as_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "seconds": self.seconds, "ttft_s": self.ttft_s, "itl_s": self.itl_s,
                "victims": len(self.victims), "is_whale": self.is_whale,
                "causes": dict(sorted(self.causes.items(), key=lambda kv: -kv[1]))}


def _split(seconds: float, causes: Mapping[str, float], into: defaultdict[str, float]) -> None:
    weights = {k: v for k, v in causes.items() if v > 0}
    total = sum(weights.values())
    if total <= 0:
        weights, total = {"other": 1.0}, 1.0
    for cause, w in weights.items():
        into[cause] += seconds * w / total


def top_culprits(results: Iterable[AttributionResult], limit: int) -> tuple[list[CulpritTotal], int]:
    """Culprits by seconds caused (largest first, ties by id), and how many results were read."""
    totals: dict[str, CulpritTotal] = {}
    n = 0
    for r in results:
        n += 1
        gaps = r.itl_gaps
        for c in r.culprits:
            itl = c.itl_s * gaps
            if c.ttft_s + itl <= 0:
                continue
            t = totals.setdefault(c.request_id, CulpritTotal(c.request_id))
            t.seconds += c.ttft_s + itl
            t.ttft_s += c.ttft_s
            t.itl_s += itl
            t.is_whale = t.is_whale or c.is_whale
            t.victims.add(r.request_id)
            if c.ttft_s > 0:
                _split(c.ttft_s, c.causes, t.causes)
            if itl > 0:
                t.causes["decode_batching"] += itl
    ranked = sorted(totals.values(), key=lambda t: (-t.seconds, t.request_id))
    return ranked[:limit], n
