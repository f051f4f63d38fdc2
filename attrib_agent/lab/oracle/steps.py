"""What one engine step did, in terms both schedulers can report, and a whole run as a list of them."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class StepView:
    """One model step (steps that schedule nothing are not counted: no model runs)."""

    scheduled: tuple[tuple[str, int], ...]  # request id -> tokens this step, sorted by id
    admitted: tuple[str, ...]  # moved from waiting to running this step (new or resumed), sorted
    preempted: tuple[str, ...]  # sorted
    blocks: tuple[tuple[str, int], ...]  # KV blocks held by each running request after scheduling, sorted
    start_ts: float = field(default=0.0, compare=False)

    def differences(self, other: StepView) -> list[str]:
        """Which parts differ from `other` ('scheduled', 'admitted', 'preempted', 'blocks')."""
        return [name for name in ("scheduled", "admitted", "preempted", "blocks")
                if getattr(self, name) != getattr(other, name)]


@dataclass(slots=True)
class RunTrace:
    """A whole run: its steps, and when each request's first token came (step index and time)."""

    steps: list[StepView] = field(default_factory=list)
    first_token_step: dict[str, int] = field(default_factory=dict)
    first_token_ts: dict[str, float] = field(default_factory=dict)
    truncated: bool = False  # hit the step limit before every request finished
