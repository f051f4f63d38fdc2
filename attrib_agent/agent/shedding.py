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

It does not start blind at share 1 (a GPU-rate stream then gave the first passes dozens of victims each, seconds of
staleness while the share fell): every pass the agent times teaches it what a victim costs (`learn_pass`), and
- the share never exceeds what the budget affords at that cost: the CPU left beside the rest of the agent over the
  victims landing a second times a victim's CPU (`affordable`), applied as soon as a pass and a second of spans
  were measured; it rises only once a whole CPU window was;
- a pass takes at most the victims its wall time allows within the freshness goal (`pass_cap`); before any pass
  was measured, one (the first pass is the measurement).
- while shedding, results seen final later than the goal (wall from the span's receipt: `saw_final`) halve the
  share, and it does not rise while a rise would take them past it (an agent within its CPU budget attributes
  every victim, late or not).
The CPU average is bias-corrected from the first reading (an average started at 0 read as "under budget" and
raised the share at the start).

A request the share leaves out is attributed all the same when it finished visibly slowed (the pipeline's
`visible_slowdown`: the slow tail an operator looks at the agent for). Those come first: at most the victims a second
the budget affords (`rescue_rate`, the pipeline's bucket), and the share is priced on what they leave
(`affordable` takes them off), so when many are slowed the share falls for the others, down to `MIN_SHARE`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Final

WINDOW_S: Final = 10.0  # CPU is averaged over about this much wall time (an exponential moving average)
STEP_S: Final = 1.0  # the share is revised at most once this often
MAX_BACKLOG_S: Final = 2.0  # an event waiting longer than this means the pipeline is behind: shed more
BEHIND_FOR_S: Final = 10.0  # ... for this long without a break: behind, not a long pass
MIN_SHARE: Final = 0.01  # never below: one request in a hundred still attributed
MAX_PASS_GAP_S: Final = 10.0  # attribution passes spaced by settle_interval_s / share, at most this much event time
RISE: Final = 1.25  # at most this factor up a step (and down by at most FALL, unless behind or unaffordable)
FALL: Final = 0.5
FRESHNESS_S: Final = 1.0  # the goal: a victim's result final this long after its span lands
PASS_FADE: Final = 0.7  # each timed pass weighs this much of the one after it in the pass-cost fit (~3 passes: a
# victim's cost grows as the timeline fills at the start, and with the busy period)


@dataclass
class PassPrice:
    """What a pass costs (wall or CPU seconds) as a fixed part (what it reads of the timeline, a refit) and a part
    per victim, fitted by least squares over the passes timed, older ones fading (`PASS_FADE`)."""

    _sums: list[float] = field(default_factory=lambda: [0.0] * 5)  # weight, n, n^2, cost, n x cost

    def add(self, victims: int, cost_s: float) -> None:
        s = self._sums
        for i in range(5):
            s[i] *= PASS_FADE
        n = float(victims)
        s[0] += 1.0
        s[1] += n
        s[2] += n * n
        s[3] += cost_s
        s[4] += n * cost_s

    def per_victim(self) -> float | None:
        """The mean cost per victim taken, the fixed part spread over them (None: no pass yet)."""
        return self._sums[3] / self._sums[1] if self._sums[1] > 0 else None

    def one(self) -> float | None:
        """What a pass taking a single victim costs: fixed + per victim where the passes tell them apart, else the
        mean pass (its fixed part may be all of it: the safe side for a price)."""
        split = self.split()
        if split is None:
            return None
        if split[0] > 0:
            return sum(split)
        return self._sums[3] / self._sums[0]

    def split(self) -> tuple[float, float] | None:
        """(fixed, per victim); where the passes do not tell them apart (all of one size, or a fit that is not a
        cost: a negative part), all of it per victim, the estimate on the safe side for a bound on victims."""
        w, n, nn, y, ny = self._sums
        mean = self.per_victim()
        if mean is None:
            return None
        den = w * nn - n * n
        if den <= 1e-9 * w * nn:
            return 0.0, mean
        marginal = (w * ny - n * y) / den
        fixed = (y - marginal * n) / w
        return (fixed, marginal) if marginal > 0 and fixed >= 0 else (0.0, mean)


@dataclass
class Shedder:
    """Decides the attributed share from CPU used and backlog age; `update` once per pipeline batch."""

    budget_cores: float
    pass_budget_s: float = 0.25  # wall time a pass may take (`pass_budget_s()` of the pipeline's settings)
    share: float = 1.0
    cores: float = 0.0  # the agent's CPU, averaged over ~WINDOW_S
    pass_cores: float = 0.0  # ... of it in the attribution passes timed (`learn_pass`)
    spans_per_s: float = 0.0  # victims landing (spans fed), averaged the same way from the first span on
    rescued_per_s: float = 0.0  # ... of them attributed outside the share as visibly slowed, averaged with them
    wall: PassPrice = field(default_factory=PassPrice)  # the timed passes' wall time
    cpu: PassPrice = field(default_factory=PassPrice)  # ... and CPU time
    _last: tuple[float, float, float, int, int] | None = None  # (wall, CPU, pass CPU, spans, rescued) at the last
    # update
    _weight: float = 0.0  # of the averages so far (their bias correction: they start at 0)
    _measured_s: float = 0.0  # wall time the averages cover
    _span_weight: float = 0.0  # ... the spans' average, which starts at the first span (not in the idle before)
    _spans_s: float = 0.0  # wall time it covers
    _pass_cpu: float = 0.0  # CPU seconds of the timed passes, in all
    _largest: int = 0  # victims of the largest pass timed
    _last_pass: tuple[int, float] | None = None  # (victims, wall s) of the last pass timed
    _priced: bool = False  # the share was revised with a pass's cost known
    _stale_s: float = 0.0  # the oldest final result since the last revision: wall from its span's receipt
    _revised: float | None = None
    _behind_since: float | None = None  # wall time the backlog last went over MAX_BACKLOG_S

    def __post_init__(self) -> None:
        if self.budget_cores <= 0:
            raise ValueError("budget_cores must be > 0")

    def learn_pass(self, victims: int, wall_s: float, cpu_s: float) -> None:
        """One attribution pass, timed by the agent: `victims` results in `wall_s` wall and `cpu_s` CPU seconds."""
        if victims <= 0:
            return
        self._pass_cpu += cpu_s
        self._largest = max(self._largest, victims)
        self._last_pass = (victims, wall_s)
        self.wall.add(victims, wall_s)
        self.cpu.add(victims, cpu_s)

    def saw_final(self, age_s: float) -> None:
        """A final result delivered `age_s` of wall time after its span was received (the freshness goal's own
        measure, as the agent sees it)."""
        self._stale_s = max(self._stale_s, age_s)

    def affordable(self) -> float | None:
        """The share the CPU budget pays for: the victims a second it affords (`rescue_rate`) less those taken as
        visibly slowed, over the victims landing a second. None until a pass and a second of spans were
        measured."""
        rate = self.rescue_rate()
        if rate is None:
            return None
        return max(0.0, rate - self.rescued_per_s) / self.spans_per_s

    def rescue_rate(self) -> float | None:
        """Victims a second the CPU budget affords: the CPU the rest of the agent leaves in it at what a pass taking
        one victim costs (its fixed part and one victim's: on the safe side, and what the passes are at a low
        share; the start's cheap passes, on a timeline still short, do not make it look cheaper by gathering many
        victims). The visibly slowed may take all of it. None until a pass and a second of spans were measured."""
        one = self.cpu.one()
        if one is None or self.spans_per_s <= 0 or self._spans_s < STEP_S:
            return None
        spare = max(0.0, self.budget_cores - (self.cores - self.pass_cores))
        return spare / max(one, 1e-9)

    def pass_cap(self) -> int:
        """How many victims a pass may take to last at most `pass_budget_s` of wall time at the fixed and
        per-victim cost learnt; one before any pass was timed (that pass is the measurement). A victim's cost is
        not a constant (it grows as the timeline fills and with the busy period), so the bound also grows at most
        twice the largest pass timed (its cost is seen before a bigger one runs), and shrinks at once in
        proportion when the last pass outran the budget. Where even one victim's pass outlasts the budget (a
        starved host), holding victims back would only add passes, each with the fixed cost: then only the
        doubling bounds a pass, and the share falls instead (`affordable`)."""
        split, last = self.wall.split(), self._last_pass
        if split is None or last is None:
            return 1
        fixed, marginal = split
        grown = 2 * self._largest
        if fixed + marginal >= self.pass_budget_s:
            return grown
        cap = min(int((self.pass_budget_s - fixed) / max(marginal, 1e-9)), grown)
        victims, wall = last
        if wall > self.pass_budget_s and victims > 1:
            cap = min(cap, int(victims * self.pass_budget_s / wall))
        return max(1, cap)

    def update(self, wall: float, cpu: float, backlog_s: float, spans: int = 0, rescued: int = 0) -> float:
        """Take the clock, the agent's CPU seconds, the spans fed so far and the requests attributed as visibly
        slowed outside the share so far (the pipeline's `slowed_rescued`); returns the share to attribute."""
        if backlog_s <= MAX_BACKLOG_S:
            self._behind_since = None
        elif self._behind_since is None:
            self._behind_since = wall
        if self._last is None:
            self._last = (wall, cpu, self._pass_cpu, spans, rescued)
            self._revised = wall
            return self.share
        w0, c0, p0, s0, r0 = self._last
        dt = wall - w0
        if dt <= 0:
            return self.share
        alpha = min(1.0, dt / WINDOW_S)
        self._measured_s += dt
        self._weight += alpha * (1.0 - self._weight)
        k = alpha / self._weight  # bias-corrected: the first reading counts in full, not an alpha of it against 0
        self.cores += k * (max(0.0, cpu - c0) / dt - self.cores)
        self.pass_cores += k * (max(0.0, self._pass_cpu - p0) / dt - self.pass_cores)
        if spans > 0:
            self._spans_s += dt
            self._span_weight += alpha * (1.0 - self._span_weight)
            k_span = alpha / self._span_weight
            self.spans_per_s += k_span * (max(0, spans - s0) / dt - self.spans_per_s)
            self.rescued_per_s += k_span * (max(0, rescued - r0) / dt - self.rescued_per_s)
        self._last = (wall, cpu, self._pass_cpu, spans, rescued)
        afford = self.affordable()
        first_price = afford is not None and not self._priced
        if not first_price and self._revised is not None and wall - self._revised < STEP_S:
            return self.share
        self._revised = wall
        self._priced = afford is not None
        if self._behind_since is not None and wall - self._behind_since >= BEHIND_FOR_S:
            target = self.share * FALL
        elif self.cores > 0:
            target = self.share * min(RISE, max(FALL, self.budget_cores / self.cores))
        else:
            target = self.share * RISE
        if self._measured_s < WINDOW_S or self._stale_s * RISE > FRESHNESS_S:
            target = min(target, self.share)  # no rise before a whole window was measured (the start's passes
            # are cheap: the timeline holds little yet), nor when as many more victims would miss the goal
        if self._stale_s > FRESHNESS_S and self.shedding:
            target = min(target, self.share * FALL)  # shedding, and results older than the goal: fewer victims
        self._stale_s = 0.0
        if backlog_s > MAX_BACKLOG_S / 2:
            target = min(target, self.share)  # never more work while events still wait
        if afford is not None:
            target = min(target, afford)  # what the passes' measured cost allows, however far below
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


def pass_budget_s(settle_interval_s: float, max_pass_wait_s: float) -> float:
    """The wall time a pass may take: half of what the freshness goal leaves after a victim waits for its settle
    tick and the pass spacing, the other half for the events that queue behind the pass (the pipeline feeds none
    while it runs); 0.25 s at the defaults, at least one settle interval."""
    return max(settle_interval_s, (FRESHNESS_S - settle_interval_s - max_pass_wait_s) / 2)
