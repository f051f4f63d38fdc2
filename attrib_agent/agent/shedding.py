"""Load shedding: when the stream brings more work than the agent's CPU budget, attribute a share of the requests that
finish (chosen by a hash of their id) and count the rest as skipped, rather than fall ever further behind.

Every engine event is still read (the timeline, the KV ledger, the step-cost model stay whole); what is shed is the
expensive part: each victim's re-simulation, and passes (run `settle_interval_s / share` apart, each taking the
victims gathered since, since a pass has a fixed cost; the pipeline holds its attribution passes to at most
`pipeline.MAX_PASS_WAIT_S` of that, now that the fixed cost is small, and the forecast refresh keeps the whole gap).
The share follows the agent's CPU over the last `WINDOW_S`
(the whole process: the loop's ingest and API as well as the pipeline thread and its renders, since the budget is
what the sidecar takes from the host) towards `budget_cores`, and halves while the
oldest waiting event has been more than `MAX_BACKLOG_S` old for `BEHIND_FOR_S` (one long pass that holds the queue
a few seconds is not falling behind; a stream faster than the pipeline keeps it there). It rises again, by at most
`RISE` a step, when both are under their bounds. Live only: a replay attributes every request (the pipeline's share
stays 1).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

WINDOW_S: Final = 10.0  # CPU is averaged over about this much wall time (an exponential moving average)
STEP_S: Final = 1.0  # the share is revised at most once this often
MAX_BACKLOG_S: Final = 2.0  # an event waiting longer than this means the pipeline is behind: shed more
BEHIND_FOR_S: Final = 10.0  # ... for this long without a break: behind, not a long pass
MIN_SHARE: Final = 0.01  # never below: one request in a hundred still attributed
MAX_PASS_GAP_S: Final = 10.0  # attribution passes spaced by settle_interval_s / share, at most this much event time
RISE: Final = 1.25  # at most this factor up a step (and down by at most FALL, unless behind)
FALL: Final = 0.5


@dataclass
class Shedder:
    """Decides the attributed share from CPU used and backlog age; `update` once per pipeline batch."""

    budget_cores: float
    share: float = 1.0
    cores: float = 0.0  # the agent's CPU, averaged over ~WINDOW_S
    _last: tuple[float, float] | None = None  # (wall, thread CPU) at the last update
    _revised: float | None = None
    _behind_since: float | None = None  # wall time the backlog last went over MAX_BACKLOG_S

    def __post_init__(self) -> None:
        if self.budget_cores <= 0:
            raise ValueError("budget_cores must be > 0")

    def update(self, wall: float, cpu: float, backlog_s: float) -> float:
        """Take the clock and the agent's CPU seconds now; returns the share to attribute."""
        if backlog_s <= MAX_BACKLOG_S:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = wall
        if self._last is None:
            self._last = (wall, cpu)
            self._revised = wall
            return self.share
        dt = wall - self._last[0]
        if dt <= 0:
            return self.share
        used = max(0.0, cpu - self._last[1]) / dt
        alpha = min(1.0, dt / WINDOW_S)
        self.cores += alpha * (used - self.cores)
        self._last = (wall, cpu)
        if self._revised is not None and wall - self._revised < STEP_S:
            return self.share
        self._revised = wall
        if self._behind_since is not None and wall - self._behind_since >= BEHIND_FOR_S:
            target = self.share * FALL
        elif self.cores > 0:
            target = self.share * min(RISE, max(FALL, self.budget_cores / self.cores))
        else:
            target = self.share * RISE
        if backlog_s > MAX_BACKLOG_S / 2:
            target = min(target, self.share)  # never more work while events still wait
        self.share = min(1.0, max(MIN_SHARE, target))
        return self.share

    @property
    def shedding(self) -> bool:
        return self.share < 1.0

    def pass_gap_s(self, settle_interval_s: float) -> float:
        """Event time between attribution passes: a pass costs about the same however few victims it takes (the
        timeline-wide views it builds), so fewer passes, each with the victims gathered since, shed that cost in
        step with the share; 0 (every settle) when not shedding."""
        return 0.0 if not self.shedding else min(MAX_PASS_GAP_S, settle_interval_s / self.share)
