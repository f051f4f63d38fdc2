"""`/v1/culprits/top`'s query: the window (a Prometheus-style duration) and the limit, checked.

The answer is the read model's (`AgentState.top_culprits`): a culprit's weight is the victim seconds it cost,
kept per window of finish time by `attribution/culprit_windows.py` so a query does not scan the store.
"""

from __future__ import annotations

import math
import re
from typing import Final

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
