"""Per-source health: successes, errors and skipped input by kind, for the agent's self-metrics.

Sources never raise bad input into the pipeline; they count it here and say what they skipped.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field


@dataclass
class SourceHealth:
    name: str
    ok_total: int = 0
    errors: Counter[str] = field(default_factory=Counter)  # I/O failures by kind: timeout, refused, http_5xx ...
    skipped: Counter[str] = field(default_factory=Counter)  # input dropped by kind: malformed, unknown_line ...
    last_success_ts: float | None = None
    last_error_ts: float | None = None
    last_error: str | None = None  # a short description, never input content

    def success(self, ts: float) -> None:
        self.ok_total += 1
        self.last_success_ts = ts

    def error(self, kind: str, ts: float, message: str = "") -> None:
        self.errors[kind] += 1
        self.last_error_ts = ts
        self.last_error = f"{kind}: {message}"[:200] if message else kind

    def skip(self, kind: str, n: int = 1) -> None:
        self.skipped[kind] += n

    @property
    def up(self) -> bool:
        """Up when the last thing that happened was a success (or nothing failed yet)."""
        if self.last_error_ts is None:
            return True
        return self.last_success_ts is not None and self.last_success_ts >= self.last_error_ts
