"""The attribution engine: each finished request's slowdown, split across the requests that caused it.

For every busy period of the engine (requests overlapping in time), the reconstructed requests are
re-simulated through vLLM's scheduling rules with every coalition of the heavy culprits (whales)
removed; a whale's blame is its Shapley value over those coalitions (what the lab's counterfactual
truth measures). What the light crowd adds beyond that is split by the simulator's step-by-step trace.
Observed slowdown = blamed parts + unexplained: when the model explains less than vLLM reported, the
rest is `unexplained`, never spread silently; when it explains more, the parts are scaled down.
"""

from __future__ import annotations

import bisect
import statistics
from collections import defaultdict, deque
from collections.abc import Hashable, Iterable, Mapping, Sequence
from contextlib import nullcontext
from dataclasses import dataclass

from attrib_agent.attribution.causes import (
    EngineView,
    engine_view,
    observed_causes,
    preempted_seconds,
    simulated_causes,
)
from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior, record_row, row_ok
from attrib_agent.attribution.neighbourhoods import bounded_neighbourhoods
from attrib_agent.attribution.period_cost import PeriodCost
from attrib_agent.attribution.result import NO_CAUSES, NO_EVIDENCE, AttributionResult, Culprit, itl_gaps
from attrib_agent.attribution.scheduler_sim import shapley, simulate
from attrib_agent.attribution.shapley import even_split, largest_effects, split_by, with_shortfall
from attrib_agent.attribution.sim_cache import CostVersions, RunCache
from attrib_agent.attribution.sim_start import StepIndex, observed_start, without
from attrib_agent.attribution.sim_trace import Pricer
from attrib_agent.attribution.sim_types import SchedulerConfig, SimOutcome, SimRequest, SimResult, SimStart, StepCost
from attrib_agent.attribution.whales import KvUse, client_uses, footprints, whales
from attrib_agent.timeline.engine_timeline import EngineTimeline
from attrib_agent.timeline.model import RequestLifecycle

OBSERVED_PREFIX = "observed"  # the one prefix group the observer can name: whatever the cache hits were
MIN_CULPRIT_S = 0.001
"""A request blamed for less than this (TTFT seconds plus ITL seconds over all the victim's gaps) is not named
as a culprit: its part stays in `unexplained`, so no culprit reads "0 ms / 0 ms" beside a share."""

@dataclass(frozen=True)
class AttributionConfig:
    whale_factor: float = 8.0  # KV footprint >= this x the period's median footprint (or 1/8 of the pool): a whale
    max_players: int = 5  # heavy culprits per busy period given exact Shapley values (2^n simulations)
    noise_floor_s: float = 0.030  # TTFT slowdown below this (or below the ratio) is "no interference"
    noise_floor_ratio: float = 0.5  # ... relative to the request's own uncontended TTFT
    itl_noise_floor_ratio: float = 0.25
    max_period_requests: int = 64  # a longer busy period is simulated around its victims only (neighbourhoods)
    offset_window: int = 512  # recent requests whose observed-minus-simulated times calibrate the baseline
    default_block_size: int = 16
    default_num_blocks: int = 4096
    # Until `prior_min_steps` engine steps are fitted, step costs come from `step_cost_prior` (docs/attribution.md).
    step_cost_prior: StepCostPrior = StepCostPrior()
    prior_min_steps: int = 64
    itl_floor_ratio: float = 0.5  # the uncontended ITL is at least this x the model's solo ITL (a bad offset)
    quality_floor_s: float = 0.05  # TTFT below this is compared at this scale in quality (timer jitter)
    unfinished_end_s: float = 3600.0  # a request with no end yet is treated as running this long after arrival
    # A long busy period's window starts at most this long before its victim arrives (or at the earliest arrival
    # overlapping it, if later), from the engine state observed there: what happened before reaches the victim
    # only through that state (who runs, who queues, KV held), not through a counterfactual. It must cover the
    # queueing that shapes a victim's TTFT (the requests ahead of it and those that delayed them), which the
    # noise floors say is seconds, not minutes; it bounds the re-simulation per victim to its own life plus this.
    window_lookback_s: float = 10.0
    # Window starts are moved back to a multiple of this (then to the step end before it, where the state is
    # observed), so victims close in time share a start and so their runs, within a settle and across settles.
    window_grid_s: float = 1.0
    run_cache_size: int = 128  # re-simulation runs kept across settles (LRU; each holds <= 64 requests' outcomes)
    # Runs are priced by a frozen copy of the step-cost fit, replaced (and the cached runs with it) only when a
    # refit moves some probe step's predicted time by more than this fraction: a refit that barely moved
    # (most, under steady load) keeps every run; 2 % of a step is well under the noise floors' scale.
    cost_tolerance: float = 0.02

    def __post_init__(self) -> None:
        if self.window_lookback_s < 0 or self.window_grid_s < 0 or self.run_cache_size < 0:
            raise ValueError("window_lookback_s, window_grid_s and run_cache_size must be >= 0")
        if self.cost_tolerance < 0:
            raise ValueError("cost_tolerance must be >= 0")


_Window = tuple[list[SimRequest], SimStart | None, set[str] | None]  # requests, start state, victims (None: all)


@dataclass(frozen=True)
class _Victim:
    lc: RequestLifecycle
    req: SimRequest


@dataclass(frozen=True, slots=True)
class _Baseline:
    """A victim's uncontended TTFT and ITL and its slowdowns over them (0 below the noise floor)."""

    ttft_s: float
    itl_s: float
    ttft_slow_s: float
    itl_slow_s: float
    blamed: bool  # slowed beyond the noise: culprits and causes are worked out
    ttft_offset_s: float  # the frontend's own share of TTFT / ITL, outside engine steps
    itl_offset_s: float
    ttft_floor_s: float  # differences below these are no interference, in the victim's result as in its worlds
    itl_floor_s: float


class _SharedRuns:
    """The runs of one window (requests and start state), shared by every plan of a pass built on it: under
    continuous load the victims of a settle mostly get the same window (the grid puts their starts together),
    and each plan asking its own coalitions re-ran the same worlds, one per victim (docs/attribution.md,
    "Tenth session (`perf11`)"). Each run waits for, and traces, the readers of all of them:
    a run's outcome for a request does not depend on when it stops or on who else is traced."""

    __slots__ = ("victims", "needy", "sims", "traced")

    def __init__(self) -> None:
        self.victims: list[str] = []  # every plan's victims: the full run's readers
        self.needy: set[str] = set()  # every plan's slowed victims: the other runs' readers
        self.sims: dict[frozenset[str], SimResult] = {}
        self.traced: dict[frozenset[str], SimResult] = {}


def _window_key(period: list[SimRequest], start: SimStart | None) -> Hashable:
    """What makes two plans' runs the same worlds (within a pass: the limits, prices and clients are the pass's):
    the same requests and the same start state."""
    return tuple(period), start


class _PeriodPlan:
    """One busy period's simulations, cached per coalition of whales present and per traced run (shared by all
    its victims, and with `shared` by other plans on the same window). A run stops once every victim in it has
    finished: only the victims' outcomes are read."""

    def __init__(self, period: list[SimRequest], victims: list[str], config: AttributionConfig,
                 sched: SchedulerConfig, cost: StepCost, start: SimStart | None = None,
                 runs: RunCache | None = None, version: int = 0, client: Mapping[str, str] | None = None,
                 shared: _SharedRuns | None = None) -> None:
        self.period = period
        # n>1 children -> their client request: one player, removed with all its children (whales.client_uses)
        self.client: Mapping[str, str] = client or {}
        self._members: dict[str, frozenset[str]] = {}
        for r in period if self.client else ():
            cid = self.client.get(r.request_id)
            if cid is not None:
                self._members[cid] = self._members.get(cid, frozenset()) | {r.request_id}
        self._start, self._runs, self._version = start, runs, version
        self.victims = victims
        ranked = whales(_footprints(period, self.client), config.whale_factor, sched.block_size * sched.num_blocks)
        self.all_whales = frozenset(ranked)  # what marks a culprit a whale
        self.whales = ranked[: config.max_players]  # the players given exact Shapley values
        self._sched, self._cost = sched, cost
        self.needy: set[str] = set()  # victims slowed beyond the noise: only they read runs but the full one
        self.floors: dict[str, tuple[float, float]] = {}  # victim -> its TTFT and ITL noise floors
        self._arrivals = {r.request_id: r.arrival_ts for r in period}
        self._relevant: dict[tuple[str, str], frozenset[str]] = {}
        self.shared = shared if shared is not None else _SharedRuns()
        self.shared.victims.extend(victims)

    def client_of(self, rid: str) -> str:
        return self.client.get(rid, rid)

    def requests_of(self, player: str) -> frozenset[str]:
        """The requests a player is: an n>1 client request's children, else itself."""
        return self._members.get(player, frozenset({player}))

    def _expand(self, removed: frozenset[str]) -> frozenset[str]:
        """The requests a coalition of players stands for: a client request's children all go together."""
        if not self._members or not removed & self._members.keys():
            return removed
        return frozenset().union(*(self.requests_of(p) for p in removed))

    def _without(self, removed: frozenset[str], readers: Iterable[str]) -> tuple[list[SimRequest], list[str]]:
        return [r for r in self.period if r.request_id not in removed], [v for v in readers if v not in removed]

    def _simulate(self, removed: frozenset[str], readers: Iterable[str], traced: bool) -> SimResult:
        """The period without `removed`, run until `readers` finish (traced, if asked): from the run cache
        when an earlier run (of this settle or one before) answers exactly, else simulated and kept there."""
        removed = self._expand(removed)
        kept, awaited = self._without(removed, readers)
        key = RunCache.key(self._start, self._sched, self._version, removed,
                           self.period[0].arrival_ts if self.period else 0.0)
        hit = self._runs.get(key, kept, awaited, traced) if self._runs is not None else None
        if hit is not None:
            return hit
        start = without(self._start, removed) if self._start is not None else None
        result = simulate(kept, self._sched, self._cost, trace=awaited if traced else None, until_done=awaited,
                          start=start)
        if self._runs is not None:
            self._runs.put(key, kept, result, awaited if traced else ())
        return result

    def run(self, present: frozenset[str]) -> SimResult:
        """Every victim reads the run with all whales; the other coalitions only the slowed victims."""
        sims = self.shared.sims
        if present not in sims:
            whales = frozenset(self.whales)
            if present == whales:
                sims[present] = self._simulate(frozenset(), self.shared.victims, False)
            elif not present or (len(present) == 1 and present <= self.shared.needy):
                # a slowed victim's world without the other whales: the run its light-crowd split traces, so
                # traced once here rather than run twice (tracing only observes: same outcomes)
                sims[present] = self.traced(whales - present)
            else:
                sims[present] = self._simulate(whales - present, self.shared.needy, False)
        return sims[present]

    def world(self, rid: str, which: str, present: frozenset[str]) -> float:
        """Victim `rid`'s re-simulated TTFT/ITL in the world where only `present` of the other whales ran."""
        own = frozenset({self.client_of(rid)}) & frozenset(self.whales)
        return _metric(self.run(present | own).outcomes.get(rid), self._arrivals[rid], which)

    def relevant(self, rid: str, which: str) -> frozenset[str]:
        """The whales some re-simulated world shows to matter to victim `rid`: a marginal effect beyond its noise
        floor. Where none does for it (the simulation misses what slowed it), those that matter to any slowed
        victim of the period: the counterfactuals' evidence, pooled."""
        own = self._relevant_to(rid, which)
        if own:
            return own
        pooled = frozenset().union(*(self._relevant_to(o, which) for o in sorted(self.needy - {rid})))
        return pooled - {rid}

    def _relevant_to(self, rid: str, which: str) -> frozenset[str]:
        key = (rid, which)
        if key not in self._relevant:
            floor = self.floors.get(rid, (0.0, 0.0))[0 if which == "ttft" else 1]
            players = [w for w in self.whales if w != self.client_of(rid)]
            effect = largest_effects(players, lambda s: self.world(rid, which, s))
            self._relevant[key] = frozenset(w for w, e in effect.items() if e >= max(floor, MIN_CULPRIT_S))
        return self._relevant[key]

    def traced(self, removed: frozenset[str]) -> SimResult:
        """The period without `removed`, each slowed victim left in it traced (one run, not one per victim)."""
        traced = self.shared.traced
        if removed not in traced:
            traced[removed] = self._simulate(removed, self.shared.needy, True)
        return traced[removed]


def busy_periods(requests: Sequence[tuple[SimRequest, float]], max_len: int) -> list[list[SimRequest]]:
    """Group (request, observed end) by overlap: a period closes when the next arrival finds the engine idle."""
    periods: list[list[SimRequest]] = []
    current: list[SimRequest] = []
    horizon = float("-inf")
    for req, end in sorted(requests, key=lambda x: (x[0].arrival_ts, x[0].request_id)):
        if current and (req.arrival_ts > horizon or len(current) >= max_len):
            periods.append(current)
            current, horizon = [], float("-inf")
        current.append(req)
        horizon = max(horizon, end)
    if current:
        periods.append(current)
    return periods


class Attributor:
    """Pure: fed a timeline, returns results. One instance keeps the online cost model between calls."""

    def __init__(self, config: AttributionConfig | None = None, cost: StepCostModel | None = None) -> None:
        self.config = config or AttributionConfig()
        self.cost = cost or StepCostModel(self.config.step_cost_prior, min_steps=self.config.prior_min_steps)
        self.period = PeriodCost(self.cost)  # prices the causes only (period_cost.py)
        # (timeline, feed position) learnt up to: iteration numbers restart with vLLM, feed positions do not
        self._learnt_to: tuple[int, int] = (0, 0)
        # observed minus re-simulated TTFT / ITL of recent requests: what the engine-step model leaves out
        # (the API server's own work before and after the engine: tokenising, queues, detokenising, streaming)
        self._ttft_offsets: deque[float] = deque(maxlen=self.config.offset_window)
        self._itl_offsets: deque[float] = deque(maxlen=self.config.offset_window)
        # ... of requests whose TTFT the steps show uncontended: the TTFT offset is learnt from these when any
        self._clean_ttft_offsets: deque[float] = deque(maxlen=self.config.offset_window)
        self.runs = RunCache(self.config.run_cache_size)  # shared by victims and settles (sim_cache.py)
        self.prices = CostVersions(self.config.cost_tolerance)
        # Set while the live agent sheds load (passes seconds apart, ~1,000 new steps each): the cost model then
        # refits once a pass (StepCostModel.deferred: equal to IRLS tolerance, not bit for bit), not every 128
        # steps. Off (replay, lab), every refit runs where it falls and the results are exactly as before.
        self.one_refit_a_pass = False

    def frontend_offsets(self) -> tuple[float, float]:
        """A low quantile of (observed - simulated): the uncontended overhead outside engine steps."""
        def q(xs: deque[float]) -> float:
            return statistics.quantiles(xs, n=4)[0] if len(xs) >= 4 else (min(xs) if xs else 0.0)
        ttft = self._clean_ttft_offsets or self._ttft_offsets
        return max(0.0, q(ttft)), q(self._itl_offsets)

    def _learn_ttft_offset(self, lc: RequestLifecycle, missed: float, view: EngineView) -> None:
        """Observed minus simulated TTFT is the frontend's time only where the steps show the request uncontended;
        elsewhere it holds what the simulation missed of the interference, so (kept apart, for when no request
        ran uncontended) only what the steps do not account for counts."""
        if view.uncontended_ttft(lc):
            self._clean_ttft_offsets.append(missed)
            return
        seen = view.seen_ttft(lc)
        self._ttft_offsets.append(missed if seen is None else min(missed, (lc.ttft_s or 0.0) - seen))

    def learn(self, timeline: EngineTimeline) -> None:
        """Feed the cost models (elapsed, and period for the causes) every step they have not seen yet, once each,
        in feed order (O(1) memory)."""
        tid, learnt_to = self._learnt_to
        if tid != id(timeline):
            learnt_to = 0
            self.period.forget_last()
        outcomes = timeline.outcomes()  # in feed order: the new steps are a tail, found by bisection
        new = outcomes[bisect.bisect_left(outcomes, learnt_to, key=lambda o: o[0].seq):]
        with (self.cost.deferred() if self.one_refit_a_pass else nullcontext(),
              self.period.model.deferred() if self.one_refit_a_pass else nullcontext()):
            for si, out in new:  # each step shaped and checked once for both fits
                record = out.record
                row = record_row(record)
                ok = row_ok(row)
                self.cost.observe_row(row, record.elapsed_s, checked=ok)
                self.period.observe_row(record, row, ok)
                learnt_to = si.seq + 1
        self._learnt_to = (id(timeline), learnt_to)

    def scheduler_config(self, timeline: EngineTimeline) -> SchedulerConfig:
        """The pool, the budget, and the prefix the requests were seen to hit, as already cached."""
        block_size, num_blocks = timeline.pool()
        hits = [timeline.cached_tokens(lc.request_id) for lc in timeline.lifecycles()]
        warm = ((OBSERVED_PREFIX, max(hits)),) if hits and max(hits) > 0 else ()
        return SchedulerConfig(block_size=block_size or self.config.default_block_size,
                               num_blocks=num_blocks or self.config.default_num_blocks,
                               token_budget=timeline.token_budget(), warm_prefixes=warm)

    def attribute(self, timeline: EngineTimeline, request_ids: Iterable[str] | None = None) -> list[AttributionResult]:
        """Results for the finished requests (all, or those named) of the timeline."""
        self.learn(timeline)
        cfg = self.scheduler_config(timeline)
        clients = timeline.clients()  # n>1 children -> their client request (empty without n>1 traffic)
        wanted = None if request_ids is None else set(request_ids)
        known: list[tuple[SimRequest, float]] = []
        lcs: dict[str, RequestLifecycle] = {}
        for lc in timeline.lifecycles():
            req = _sim_request(lc, timeline.cached_tokens(lc.request_id))
            if req is None:
                continue
            lcs[lc.request_id] = lc
            end = lc.end_ts if lc.end_ts is not None else req.arrival_ts + self.config.unfinished_end_s
            known.append((req, end))
        # the fits frozen for the pass (the same formula on the same coefficients: the same prices), so a
        # decode-only step's members are priced in one loop (`StepPrices.marginals`)
        view = engine_view(timeline, cfg, Pricer(self.period.prices(self.cost)))
        prices = self.prices.current(self.cost)
        plans = []
        windows: dict[Hashable, _SharedRuns] = {}
        for period, start, mine in self._periods(known, lcs, wanted, timeline):
            victims = [_Victim(lcs[r.request_id], r) for r in period
                       if lcs[r.request_id].complete and (mine is None or r.request_id in mine)]
            if victims:
                key = _window_key(period, start)
                shared = windows.get(key)
                if shared is None:
                    shared = windows[key] = _SharedRuns()
                plan = _PeriodPlan(period, [v.req.request_id for v in victims], self.config, cfg, prices, start,
                                   self.runs, self.prices.version, clients, shared)
                plans.append((plan, victims))
        for plan, victims in plans:  # once every plan sharing a window has its victims there: one run for all
            full = plan.run(frozenset(plan.whales)).outcomes
            for v in victims:
                o = full.get(v.req.request_id)
                if o is not None and v.lc.ttft_s is not None:
                    self._learn_ttft_offset(v.lc, v.lc.ttft_s - _metric(o, v.req.arrival_ts, "ttft"), view)
                if o is not None and v.lc.mean_itl_s is not None and o.mean_itl_s is not None:
                    self._itl_offsets.append(v.lc.mean_itl_s - o.mean_itl_s)
        # a culprit is in its victim's period: block-seconds of those alone, not the ledger of every request held
        kv = timeline.block_seconds({r.request_id for plan, _ in plans for r in plan.period})
        for child, cid in clients.items():  # a client request's blocks: its children's
            if child in kv:
                kv[cid] = kv.get(cid, 0.0) + kv[child]
        membership = timeline.membership_quality().exact_share
        offsets = self.frontend_offsets()  # fixed from here on: only the loop above feeds them
        planned = []
        for plan, victims in plans:  # every plan's slowed victims known before any run waits for them
            bases = [self._baseline(v, cfg.token_budget, offsets) for v in victims]
            plan.needy = {v.req.request_id for v, b in zip(victims, bases, strict=True) if b.blamed}
            plan.shared.needy |= plan.needy
            plan.floors = {v.req.request_id: (b.ttft_floor_s, b.itl_floor_s)
                           for v, b in zip(victims, bases, strict=True)}
            planned.append((plan, victims, bases))
        out: list[AttributionResult] = []
        for plan, victims, bases in planned:
            for v, base in zip(victims, bases, strict=True):
                out.append(self._victim(v, plan, kv, membership, base, view))
        return out

    def _periods(self, known: list[tuple[SimRequest, float]], lcs: dict[str, RequestLifecycle],
                 wanted: set[str] | None, timeline: EngineTimeline) -> list[_Window]:
        """Busy periods, each simulated whole (from an idle engine) when short; a long one (continuous load) in
        windows around its victims, each bounded in time and started from the engine state observed there. Each
        comes with the victims it is for (None: all), so a victim is attributed once, in the window built for it,
        though neighbouring windows hold it too."""
        limit = self.config.max_period_requests
        if wanted is None:  # everything (batch scoring): the fixed windows of the period
            return [(p, None, None) for p in busy_periods(known, limit)]
        ends = {r.request_id: e for r, e in known}
        out: list[_Window] = []
        index: StepIndex | None = None
        for chain in busy_periods(known, len(known) + 1):
            victims = {r.request_id for r in chain if r.request_id in wanted and lcs[r.request_id].complete}
            if not victims:
                continue
            first_victim = min(r.arrival_ts for r in chain if r.request_id in victims)
            if len(chain) <= limit and chain[0].arrival_ts >= first_victim - self.config.window_lookback_s:
                out.append((chain, None, victims))  # a burst: the whole of it, as short as any window
                continue
            index = index or StepIndex(timeline.steps(), timeline.step_ends())  # in end order, kept
            for lo, window, mine in bounded_neighbourhoods([(r, ends[r.request_id]) for r in chain], victims, limit,
                                                     self.config.window_lookback_s,
                                                     index.snapper(self.config.window_grid_s)):
                if len(window) >= limit:  # cut to the latest arrivals: start where the kept ones begin, ungridded
                    at = index.before(window[0].arrival_ts)
                    lo = max(lo, at.end_ts) if at is not None else lo
                step = index.before(lo)
                if step is None or step.end_ts != lo:  # no step held there: from an idle engine, as before
                    out.append((window, None, mine))
                    continue
                start, kept = observed_start(step, window, ends, lcs)
                out.append((kept, start, mine))
        return out

    def slowdowns(self, lc: RequestLifecycle, cached_tokens: int, token_budget: int,
                  offsets: tuple[float, float]) -> tuple[float, float]:
        """A finished request's (TTFT, per-token ITL) slowdowns over its uncontended baseline, as its result would
        state them, from its own times and the step-cost model alone (no re-simulation): cheap enough for the
        pipeline to ask of every request that lands while it sheds. `offsets`: `frontend_offsets()`."""
        req = _sim_request(lc, cached_tokens)
        if req is None or not lc.complete:
            return 0.0, 0.0
        base = self._baseline(_Victim(lc, req), token_budget, offsets)
        return base.ttft_slow_s, base.itl_slow_s

    def _baseline(self, v: _Victim, token_budget: int, offsets: tuple[float, float]) -> _Baseline:
        ttft_off, itl_off = offsets
        base_ttft = self.cost.solo_ttft_s(v.req.prompt_tokens, token_budget, v.req.prefix_tokens) + ttft_off
        solo_itl = self.cost.solo_itl_s(v.req.prompt_tokens + v.req.output_tokens // 2)
        base_itl = max(self.config.itl_floor_ratio * solo_itl, solo_itl + itl_off)
        ttft_slow = max(0.0, (v.lc.ttft_s or 0.0) - base_ttft)
        itl_slow = max(0.0, (v.lc.mean_itl_s or 0.0) - base_itl)
        ttft_floor = max(self.config.noise_floor_s, self.config.noise_floor_ratio * base_ttft)
        itl_floor = self.config.itl_noise_floor_ratio * base_itl
        quiet = ttft_slow < ttft_floor and itl_slow < itl_floor
        if ttft_slow < ttft_floor:
            ttft_slow = 0.0
        if itl_slow < itl_floor:
            itl_slow = 0.0
        return _Baseline(base_ttft, base_itl, ttft_slow, itl_slow, not quiet and (ttft_slow > 0 or itl_slow > 0),
                         ttft_off, itl_off, ttft_floor, itl_floor)

    def _victim(self, v: _Victim, plan: _PeriodPlan, kv: dict[str, float], membership: float,
                base: _Baseline, view: EngineView) -> AttributionResult:
        whale_list, whale_set, runner = plan.whales, set(plan.whales), plan.run
        rid = v.req.request_id
        me = plan.client_of(rid)  # an n>1 child's client request: never a player against its own children
        players = [w for w in whale_list if w != me]
        obs_ttft, obs_itl = v.lc.ttft_s, v.lc.mean_itl_s
        base_ttft, base_itl, ttft_slow, itl_slow = base.ttft_s, base.itl_s, base.ttft_slow_s, base.itl_slow_s

        factual = frozenset(players)
        observed_engine = {"ttft": None if obs_ttft is None else obs_ttft - base.ttft_offset_s,
                           "itl": None if obs_itl is None else obs_itl - base.itl_offset_s}

        def metric(present: frozenset[str], which: str) -> float:
            return plan.world(rid, which, present)

        blame_ttft: dict[str, float] = defaultdict(float)
        blame_itl: dict[str, float] = defaultdict(float)
        # causes label blamed seconds, and where no world shows a whale to matter they decide the shortfall's split
        mech = observed_causes(v.lc, view) if base.blamed else None
        by_steps: dict[str, Mapping[str, float]] = {}  # phase -> the shortfall's split the observed steps decided
        if base.blamed:
            for which, slow, blame in (("ttft", ttft_slow, blame_ttft), ("itl", itl_slow, blame_itl)):
                if slow <= 0:
                    continue
                none = metric(frozenset(), which)

                def value(s: frozenset[str], w: str = which, n: float = none) -> float:
                    return metric(s, w) - n

                # The world that happened is observed (less the frontend's own time): what the re-simulation
                # leaves out of it goes to the players in proportion to what the counterfactuals show they did.
                seen = observed_engine[which]
                shortfall = 0.0 if seen is None or not players else seen - metric(factual, which)
                parts = even_split(shortfall, plan.relevant(rid, which)) if shortfall else {}
                if not parts and shortfall > 0 and mech is not None:  # the observed steps say who was there
                    by_steps[which] = fractions = mech.shares(which, {p: plan.requests_of(p) for p in players})
                    parts = split_by(shortfall, fractions)
                phi = with_shortfall(shapley(players, value), parts) if players else {}
                for p, val in phi.items():
                    blame[p] += max(0.0, val)
                light = none - (base_ttft if which == "ttft" else base_itl)
                if light > 0:
                    for other, secs in self._light_split(plan, players, rid, which).items():
                        blame[plan.client_of(other)] += light * secs
                _fit_to(blame, slow)
        n_gaps = itl_gaps(v.lc.completion_tokens)
        for other in list(set(blame_ttft) | set(blame_itl)):  # too little to name: it joins the unexplained
            if blame_ttft.get(other, 0.0) + n_gaps * blame_itl.get(other, 0.0) < MIN_CULPRIT_S or (
                    other == me != rid):  # (its siblings: the client's own doing, no other request's)
                blame_ttft.pop(other, None)
                blame_itl.pop(other, None)
        # a victim nobody is blamed for reports only its preempted time
        if mech is None and base.blamed:
            mech = simulated_causes(plan.traced(frozenset()).outcomes[rid])
        unexplained_ttft = max(0.0, ttft_slow - sum(blame_ttft.values()))
        unexplained_itl = max(0.0, itl_slow - sum(blame_itl.values()))
        itl_blamed: float = sum(blame_itl.values())  # typed: mypyc took int * sum(...) for int arithmetic
        total = sum(blame_ttft.values()) + n_gaps * itl_blamed
        culprits = []
        for other in sorted(set(blame_ttft) | set(blame_itl)):
            t, i = blame_ttft.get(other, 0.0), blame_itl.get(other, 0.0)
            ttft_causes = mech.split(other, "ttft", t) if mech else NO_CAUSES
            itl_causes = mech.split(other, "itl", i) if mech else NO_CAUSES
            culprits.append(Culprit(
                request_id=other, ttft_s=t, itl_s=i, share=(t + n_gaps * i) / total if total > 0 else 0.0,
                causes=ttft_causes, kv_block_seconds=kv.get(other, 0.0), is_whale=other in plan.all_whales,
                itl_causes=itl_causes))
        culprits.sort(key=lambda c: (-(c.ttft_s + n_gaps * c.itl_s), c.request_id))
        full = runner(frozenset(whale_list)).outcomes.get(rid)
        sim_ttft = _metric(full, v.req.arrival_ts, "ttft") + base.ttft_offset_s  # the frontend's part, as learnt
        scale = max(obs_ttft or 0.0, self.config.quality_floor_s)
        fidelity = 1.0 - min(1.0, abs(sim_ttft - (obs_ttft or 0.0)) / scale)
        return AttributionResult(
            request_id=rid, finished_ts=v.lc.end_ts or v.req.arrival_ts, ttft_s=obs_ttft, ttft_baseline_s=base_ttft,
            ttft_slowdown_s=ttft_slow, itl_s=obs_itl, itl_baseline_s=base_itl, itl_slowdown_s=itl_slow,
            culprits=tuple(culprits), unexplained_ttft_s=unexplained_ttft, unexplained_itl_s=unexplained_itl,
            no_interference=ttft_slow == 0.0 and itl_slow == 0.0, quality=max(0.0, fidelity) * membership,
            is_whale=me in whale_set, engine=v.lc.engine, arrival_ts=v.lc.arrival_ts,
            prompt_tokens=v.lc.prompt_tokens, completion_tokens=v.lc.completion_tokens,
            preempted_s=mech.preempted_s if mech else 0.0 if base.blamed else preempted_seconds(v.lc, view),
            evidence=mech.evidence_for(*(c.causes for c in culprits), *(c.itl_causes for c in culprits),
                                       comembership=_comembership(culprits, by_steps)) if mech else NO_EVIDENCE)

    @staticmethod
    def _light_split(plan: _PeriodPlan, players: list[str], rid: str, which: str) -> dict[str, float]:
        """Fractions (summing to 1) of the light crowd's effect, from a traced run without the whales."""
        traced = plan.traced(frozenset(players)).outcomes[rid]
        return _normalised(_trace_by_request(traced, which))


def _comembership(culprits: Iterable[Culprit], by_steps: Mapping[str, Mapping[str, float]]) -> set[str]:
    """The causes labelling the seconds of culprits given a share of the shortfall by the observed steps."""
    marked: set[str] = set()
    for c in culprits if by_steps else ():
        if by_steps.get("ttft", {}).get(c.request_id, 0.0) > 0:
            marked.update(c.causes)
        if by_steps.get("itl", {}).get(c.request_id, 0.0) > 0:
            marked.update(c.itl_causes)
    return marked


def _footprints(period: list[SimRequest], client: Mapping[str, str]) -> dict[str, int]:
    """KV footprints (whales.py): a shared prefix (`prefix_tokens`, where the re-simulation knows one) is held in
    common, so it does not count towards any one request's weight, nor towards the first of its group's. An n>1
    request's children count as their client request (`client_uses`)."""
    ordered = sorted(period, key=lambda r: (r.arrival_ts, r.request_id))
    return footprints(client_uses((KvUse(r.request_id, r.prompt_tokens, r.output_tokens, r.prefix_tokens)
                                   for r in ordered), client))


def _sim_request(lc: RequestLifecycle, cached: int = 0) -> SimRequest | None:
    """A request as the re-simulation takes it; one that hit the prefix cache shares the observed prefix
    (the observer cannot tell shared prefixes apart, so every hit is taken as the same leading tokens)."""
    if lc.arrival_ts is None or lc.prompt_tokens is None:
        return None
    out = lc.completion_tokens if lc.completion_tokens is not None else (lc.max_tokens or 1)
    return SimRequest(lc.request_id, lc.arrival_ts, lc.prompt_tokens, max(out, 1),
                      OBSERVED_PREFIX if cached > 0 else None, cached)


def _metric(o: SimOutcome | None, arrival_ts: float, which: str) -> float:
    if o is None:
        return 0.0
    if which == "ttft":
        t = o.ttft_s(arrival_ts)
        return 0.0 if t is None else t
    return o.mean_itl_s or 0.0


def _trace_by_request(o: SimOutcome, which: str) -> dict[str, float]:
    acc: dict[str, float] = defaultdict(float)
    first = o.first_token_ts
    for w in o.waits:
        in_ttft = first is None or w.ts is None or w.ts < first
        if (which == "ttft") != in_ttft:
            continue
        for other, secs in w.by_request:
            acc[other] += secs
    return acc


def _normalised(d: dict[str, float]) -> dict[str, float]:
    total = sum(v for v in d.values() if v > 0)
    return {k: v / total for k, v in d.items() if v > 0} if total > 0 else {}


def _fit_to(blame: dict[str, float], observed: float) -> None:
    """Scale blame down when the model explains more than was observed; never up (the rest is unexplained)."""
    total = sum(blame.values())
    if total > observed > 0:
        for k in blame:
            blame[k] *= observed / total
