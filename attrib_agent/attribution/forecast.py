"""Admission forecast: what admitting a request now would cost the requests already on the engine.

Pure: an engine state in (who runs and who waits, with their tokens so far, the KV pool, the token budget),
a forecast out. The near future is re-run twice through the same vLLM scheduling rules the attribution uses
(`sim_step.schedule_step`, priced by the fitted step-cost model), from the state as it is, with and without
the candidates; the difference, request by request, is the harm. Requests expected to arrive meanwhile (a
rate and a typical size, learnt from recent arrivals or declared by the caller) are run too, since a whale
mostly hurts those that come after it: the two are reported apart.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace

from attrib_agent.attribution.cost_model import PriceRange
from attrib_agent.attribution.forecast_sim import Run, Window, simulate_from
from attrib_agent.attribution.forecast_types import ArrivalLoad, Candidate, EngineState, InFlight
from attrib_agent.attribution.sim_step import blocks_for
from attrib_agent.attribution.sim_types import SimRequest, StepCost
from attrib_agent.attribution.slo import SloConfig
from attrib_agent.attribution.step_shape import prefill_pairs

__all__ = ["ArrivalLoad", "Baseline", "Candidate", "EngineState", "Forecast", "ForecastConfig", "ForecastSettings",
           "Harm", "InFlight", "PriceCheck", "Run", "arrival_chance", "baseline", "forecast", "phase_extra_s",
           "price_check"]

CANDIDATE_PREFIX = "candidate-"
EXPECTED_PREFIX = "expected-"
PROBE_ID = f"{EXPECTED_PREFIX}probe"
"""With no load known (none declared, none learnt, none saved), one probe arrival of the smallest size (a token
in, a token out) right behind the candidate: its extra TTFT is the wait the candidate puts on whoever comes next,
head-of-line on its prefill, with no cost of its own. Expecting nobody (the forecast before) read as a
confident "harmless" for a whale that then held up every short of a stream the agent had not seen yet."""


@dataclass(frozen=True)
class ForecastConfig:
    ttft_slo_s: float = SloConfig().ttft_s  # the goodput budgets (seed 002's: TTFT < 5 s, ITL p95 < 250 ms)
    itl_p95_slo_s: float = SloConfig().itl_s
    horizon_s: float = 10.0  # expected arrivals are run over this much of the future
    max_expected: int = 64  # ... at most this many (bounds the forecast's cost)
    max_steps: int = 20_000  # per simulated run
    harmless_s: float = 0.05  # summed extra TTFT below this calls a candidate harmless ...
    slowed_ratio: float = 2.0  # ... and so does no request's TTFT or mean ITL made this many times longer
    harmless_arrival_chance: float = 0.05  # ... and, when the stream's phase is unknown, a chance under this that
    # its next arrival lands while the candidate holds it back (`arrival_chance`): "harmless" promises nobody
    # slowed 2x, and an arrival landing there is; the promise kept 19 times in 20, the 95 % the lab asks of a
    # truth's harm before calling it resolved (two standard errors). Above 1: the check is off

    def __post_init__(self) -> None:
        if min(self.ttft_slo_s, self.itl_p95_slo_s, self.horizon_s) <= 0 or self.max_expected < 0:
            raise ValueError("SLOs and horizon_s must be > 0, max_expected >= 0")
        if self.max_steps < 1 or self.harmless_s < 0 or not self.slowed_ratio > 1:
            raise ValueError("max_steps must be >= 1, harmless_s >= 0 and slowed_ratio > 1")
        if not self.harmless_arrival_chance > 0:
            raise ValueError("harmless_arrival_chance must be > 0")


@dataclass(frozen=True, slots=True)
class Harm:
    """Extra latency the candidate causes a group of requests: sums and worst, and SLOs newly broken."""

    requests: int
    ttft_extra_sum_s: float
    ttft_extra_max_s: float
    itl_extra_sum_s: float  # extra mean ITL over their tokens within the horizon, summed over requests
    itl_extra_max_s: float
    ttft_slo_pushed: int  # within the TTFT SLO without the candidate, beyond it with
    itl_slo_pushed: int  # likewise the ITL p95 SLO
    ttft_extra_by_request: tuple[tuple[str, float], ...] = ()  # those with extra TTFT > 0 (not exported)
    slowed: int = 0  # whose TTFT (arrival to first token) or mean ITL the candidate makes `slowed_ratio` times
    # longer or more, the time without it taken as at least one step's (`forecast._harm`)
    phase_extra_s: float = 0.0  # of `ttft_extra_sum_s`, the part no run shows: a stream of unknown phase
    # averaged over its phase (`phase_extra_s`); 0 for the requests in flight and a known phase

    def as_dict(self) -> dict[str, float | int]:
        return {"requests": self.requests, "ttft_extra_sum_s": self.ttft_extra_sum_s,
                "ttft_extra_max_s": self.ttft_extra_max_s, "itl_extra_sum_s": self.itl_extra_sum_s,
                "itl_extra_max_s": self.itl_extra_max_s, "ttft_slo_pushed": self.ttft_slo_pushed,
                "itl_slo_pushed": self.itl_slo_pushed, "slowed": self.slowed, "phase_extra_s": self.phase_extra_s}


@dataclass(frozen=True, slots=True)
class PriceCheck:
    """Whether the candidate's prefill is priced from evidence: `needed`, its largest chunk alone (the budget's
    worth of its uncached prompt; the pairs of its chunk attending over the most context), against `seen`, the
    largest the fit was fitted on. Beyond it the price is the prior's or an extrapolation: a fit of 1,024-token
    prompts priced a 3,900-token whale's two chunks 80 ms against 152 ms (the second, over 2,048 tokens of
    context, cheaper than the first), the prior a 7,600-token one's four 1.29 s against 0.46 s."""

    seen: PriceRange
    needed: PriceRange

    @property
    def extrapolated(self) -> bool:
        return not self.seen.covers(self.needed.prefill_tokens, self.needed.prefill_pairs)

    def as_dict(self) -> dict[str, object]:
        return {"price_evidence": "extrapolated" if self.extrapolated else "fitted",
                "price_seen": {"prefill_tokens": self.seen.prefill_tokens, "prefill_pairs": self.seen.prefill_pairs,
                               "decodes_beside": self.seen.beside},
                "price_needed": {"prefill_tokens": self.needed.prefill_tokens,
                                 "prefill_pairs": self.needed.prefill_pairs}}


def price_check(candidate: Candidate, token_budget: int, cost: object) -> PriceCheck | None:
    """The candidate's `PriceCheck` against the range of `cost` (its `price_range`: `StepCostModel`'s, kept by the
    forecast's scaled copy); None for a cost that keeps none (a fixed price). An attribute read, not a protocol
    check: `isinstance` on a runtime protocol cost more than the rest of a cached forecast."""
    seen = getattr(cost, "price_range", None)
    if not isinstance(seen, PriceRange):
        return None
    budget = max(token_budget, 1)
    done = min(candidate.cached_prefix_tokens, candidate.prompt_tokens - 1)
    left = candidate.prompt_tokens - done
    tokens = min(budget, left)
    pairs = 0
    while left > 0:  # the last full-budget chunk or the remainder after it: whichever attends over more
        chunk = min(budget, left)
        pairs = max(pairs, prefill_pairs(done, chunk))
        done += chunk
        left -= chunk
    return PriceCheck(seen, PriceRange(tokens, pairs))


@dataclass(frozen=True, slots=True)
class Forecast:
    candidate: Candidate
    refused: bool  # its whole sequence can never fit in the pool: vLLM will not take it
    admitted_now: bool  # scheduled in the very next step
    wait_reason: str | None  # why not: "kv" (free blocks), "budget", "seats", "queue" (behind others)
    own_ttft_s: float | None  # first candidate's predicted TTFT (None: not within the simulated steps)
    in_flight: Harm  # the requests running or queued now
    expected: Harm  # the requests expected to arrive within the horizon
    expected_load: ArrivalLoad | None
    preemptions: int  # extra preemptions the candidate causes
    load_basis: str = "declared"  # what `expected` is: declared, learnt, saved (the last agent's) or probe
    stay_s: float | None = None  # from now to its last token, its decode priced alone (a lower bound; not exported)
    price: PriceCheck | None = None  # whether its prefill's price rests on chunks the fit has seen
    arrival_chance: float | None = None  # the chance the next arrival lands while the candidate holds it back
    # (`arrival_chance`), for a stream whose phase is unknown; None when it is known (or no stream)

    @property
    def extrapolated(self) -> bool:
        return self.price is not None and self.price.extrapolated

    @property
    def ttft_extra_sum_s(self) -> float:
        return self.in_flight.ttft_extra_sum_s + self.expected.ttft_extra_sum_s

    def harmless(self, config: ForecastConfig) -> bool:
        """Summed extra TTFT under `harmless_s`, nobody in flight pushed past the ITL SLO, and nobody slowed
        `slowed_ratio` times (`Harm.slowed`): a sum under 50 ms can still be one short's 4 ms TTFT made 40 ms,
        the 2x slowdown a router routes away from. With no load known (the probe) that says only what the next
        arrival would wait: a candidate that stays on the engine longer than `harmless_s` (a 32-token prompt
        decoding 1,500 tokens) can still slow a stream the agent has not seen, so it is not called harmless;
        `load_basis` says why. Nor is one whose prefill is priced beyond what the fit has seen (`PriceCheck`): the
        fit's price of an unseen chunk can be half its time, and a prefill priced short ends before the next
        arrival: "harmless" from a price no evidence supports; `price_evidence` says so. Nor, when the stream's
        phase is unknown, one its next arrival has `harmless_arrival_chance` or more chance to land behind: the
        runs place that arrival half a gap ahead, after a prefill shorter than that, while a Poisson stream lands
        in it (mixed/w1 in the lab: 0.12 s priced, 2.47 shorts/s, 25 %; one came 0.106 s after it, slowed 5x)."""
        if self.extrapolated:
            return False
        if self.arrival_chance is not None and self.arrival_chance >= config.harmless_arrival_chance:
            return False
        if self.load_basis == "probe" and (self.stay_s is None or self.stay_s >= config.harmless_s):
            return False
        return (self.ttft_extra_sum_s < config.harmless_s and not self.in_flight.itl_slo_pushed
                and not self.in_flight.slowed and not self.expected.slowed)

    def as_dict(self) -> dict[str, object]:
        c = self.candidate
        return {"candidate": {"prompt_tokens": c.prompt_tokens, "max_tokens": c.max_tokens,
                              "cached_prefix_tokens": c.cached_prefix_tokens},
                "refused": self.refused, "admitted_now": self.admitted_now, "wait_reason": self.wait_reason,
                "own_ttft_s": self.own_ttft_s, "ttft_extra_sum_s": self.ttft_extra_sum_s,
                "in_flight": self.in_flight.as_dict(), "expected_arrivals": self.expected.as_dict(),
                "expected_load": None if self.expected_load is None else {
                    "rate_per_s": self.expected_load.rate_per_s, "prompt_tokens": self.expected_load.prompt_tokens,
                    "max_tokens": self.expected_load.max_tokens, "first_in_s": self.expected_load.first_in_s,
                    "mix": [list(m) for m in self.expected_load.mix],
                    "cached_prefix_tokens": self.expected_load.cached_prefix_tokens},
                "load_basis": self.load_basis, "extra_preemptions": self.preemptions,
                "arrival_chance": self.arrival_chance} | (
                    {"price_evidence": None} if self.price is None else self.price.as_dict())


def _unknown_phase_rate(load: ArrivalLoad | None) -> float | None:
    """The rate of a stream whose next arrival's time is not known, only its rate: learnt, saved, or declared
    without `first_in_s` (the runs then place it half a gap ahead); None for a known phase, or no stream arriving."""
    return load.rate_per_s if load is not None and load.first_in_s is None and load.rate_per_s > 0 else None


def arrival_chance(load: ArrivalLoad | None, exposure_s: float | None) -> float | None:
    """The chance that a Poisson stream of `load`'s rate has an arrival within `exposure_s` (1 - exp(-rate x
    exposure)): the next arrival landing while the candidate holds it back, head-of-line behind its wait and
    prefill (`forecast` passes that time less its end, where a newcomer is not slowed 2x: `_unslowed_tail_s`).
    Only a stream whose phase is unknown (no `first_in_s`: learnt, saved, or declared without it) has
    one; a declared `first_in_s` keeps its phase and the runs place that arrival where it is (None). An
    exposure unknown (no first token within the run) is a certainty."""
    if (rate := _unknown_phase_rate(load)) is None:
        return None
    if exposure_s is None:
        return 1.0
    return -math.expm1(-rate * max(exposure_s, 0.0))


def phase_extra_s(load: ArrivalLoad | None, exposure_s: float | None) -> float:
    """The extra TTFT the arrivals landing within `exposure_s` (the candidate's wait and prefill) are expected to
    wait behind it, averaged over a stream whose phase is unknown, beyond what the runs show with the next arrival
    placed half a gap ahead. Over a uniform phase (or a Poisson stream) of rate r the arrivals within E wait
    r E^2 / 2 in all, each E minus its arrival; the runs' evenly placed arrivals give that exactly over every whole
    gap (a midpoint), so what differs is the last, partial one, of length p: p^2 / 2g before its midpoint
    (no placed arrival lands in it), (g - p)^2 / 2g after. At most an eighth of a gap: 0 for a known phase."""
    if (rate := _unknown_phase_rate(load)) is None or exposure_s is None:
        return 0.0
    gap = 1.0 / rate
    part = max(exposure_s, 0.0) % gap
    return (part if part < 0.5 * gap else gap - part) ** 2 / (2.0 * gap)


def expected_arrivals(state: EngineState, config: ForecastConfig) -> list[SimRequest]:
    """The arrivals the load predicts within the horizon; with no load, the probe (`PROBE_ID`)."""
    load = state.load
    if load is None:
        return [SimRequest(PROBE_ID, state.now, 1, 1)]
    if load.rate_per_s <= 0:  # a declared "nobody comes"
        return []
    gap = 1.0 / load.rate_per_s
    first = 0.5 * gap if load.first_in_s is None else load.first_in_s
    n = min(config.max_expected, max(int((config.horizon_s - first) / gap) + 1, 0))
    shared = load.cached_prefix_tokens
    return [SimRequest(f"{EXPECTED_PREFIX}{i}", state.now + first + i * gap, p, m,
                       EXPECTED_PREFIX if shared else None, min(shared, p - 1))
            for i, (p, m) in ((i, load.size(i)) for i in range(n))]


@dataclass(frozen=True, slots=True)
class Baseline:
    """The future without any candidate, and what every candidate's forecast from the same state reads beside it
    (the expected arrivals, the ids compared, in the order their harms are summed): built once per state, so a
    new candidate on a kept snapshot (`forecast_cache`) costs its own run and the comparison only."""

    run: Run
    expected: tuple[SimRequest, ...]
    watch: frozenset[str]  # the requests on the engine and those expected
    in_flight: tuple[str, ...]  # the requests on the engine, sorted
    arriving: tuple[str, ...]  # the expected ones, sorted
    awaiting: dict[str, float]  # arrival of each request on the engine without a first token
    arrivals: dict[str, float]  # arrival of each expected one


def baseline(state: EngineState, cost: StepCost, config: ForecastConfig | None = None) -> Baseline:
    """The `Baseline` of a state: it depends on the state, the cost model and the config only."""
    cfg = config or ForecastConfig()
    expected = tuple(expected_arrivals(state, cfg))
    arrivals = {r.request_id: r.arrival_ts for r in expected}
    watch = frozenset({r.request_id for r in state.requests} | arrivals.keys())
    run = simulate_from(state, cost, [(r, 0) for r in expected], set(watch), cfg.max_steps,
                        until=window_end(state, cfg), itl_limit=cfg.itl_p95_slo_s, keep_tokens=False)
    return Baseline(run, expected, watch, tuple(sorted({r.request_id for r in state.requests})),
                    tuple(sorted(arrivals)),
                    {r.request_id: r.arrival_ts for r in state.requests if r.first_token_ts is None}, arrivals)


def forecast(state: EngineState, candidates: Sequence[Candidate], cost: StepCost,
             config: ForecastConfig | None = None, base: Baseline | None = None) -> list[Forecast]:
    """One forecast per candidate, each admitted alone now; the future without any is run once for all (or
    taken from `base`, the `baseline` of the same state, cost and config)."""
    cfg = config or ForecastConfig()
    if base is None:
        base = baseline(state, cost, cfg)
    cid = f"{CANDIDATE_PREFIX}0"
    watch = set(base.watch)
    watch.add(cid)
    queued = [(r, 0) for r in base.expected]
    usable = state.sched.num_blocks - 1
    step_s = cost.step_seconds(0, 1, 1)  # one step's time: the least a TTFT or a token gap can be
    tail = _unslowed_tail_s(base, state.ttft_offset_s, cfg, step_s)
    out = []
    for c in candidates:
        cand = SimRequest(cid, state.now, c.prompt_tokens, c.max_tokens)
        refused = blocks_for(c.prompt_tokens + c.max_tokens - 1, state.sched.block_size) > usable
        run = simulate_from(state, cost, [(cand, c.cached_prefix_tokens), *queued], watch, cfg.max_steps,
                            first_token_only=frozenset({cid}), until=window_end(state, cfg),
                            itl_limit=cfg.itl_p95_slo_s, keep_tokens=False)
        first = run.first_token.get(cid)
        stay = None if first is None else first - state.now + (c.max_tokens - 1) * cost.step_seconds(
            0, 1, c.prompt_tokens)
        admitted = cid in run.first_members
        reason = None if admitted or refused else (
            run.first_stop if run.first_blocked == cid or run.first_stop in ("budget", "seats", "preemption")
            else "queue")
        exposure = None if first is None else first - state.now  # a newcomer queues behind it till then
        expected = _harm(base.run, run, base.arrivals, base.arriving, state.ttft_offset_s, cfg, step_s)
        phase = phase_extra_s(state.load, exposure)
        if phase > 0:
            expected = replace(expected, ttft_extra_sum_s=expected.ttft_extra_sum_s + phase, phase_extra_s=phase)
        out.append(Forecast(
            c, refused, admitted, reason,
            None if first is None else first - state.now + state.ttft_offset_s,
            _harm(base.run, run, base.awaiting, base.in_flight, state.ttft_offset_s, cfg, step_s), expected,
            state.load, max(run.preemptions - base.run.preemptions, 0),
            "probe" if state.load is None else state.load_basis, stay,
            price_check(c, state.sched.token_budget, cost),
            arrival_chance(state.load, None if exposure is None else exposure - tail)))
    return out


def _unslowed_tail_s(base: Baseline, offset_s: float, cfg: ForecastConfig, step_s: float) -> float:
    """The end of the candidate's hold in which a newcomer lands and is not slowed `slowed_ratio` times: it waits
    there less than (ratio - 1) times its TTFT without the candidate (the next expected arrival's, in the run
    without it, frontend included; at least a step). Left out of `arrival_chance`'s exposure: that chance is of
    a 2x, what `harmless` promises there is none of."""
    ttft = step_s
    if base.expected:
        nxt = base.expected[0]
        got = base.run.first_token.get(nxt.request_id)
        if got is not None:
            ttft = max(got - nxt.arrival_ts + offset_s, step_s)
    return (cfg.slowed_ratio - 1.0) * ttft


def window_end(state: EngineState, cfg: ForecastConfig) -> float:
    """The end of the window ITL and preemptions are compared over (TTFTs are followed past it to the last
    watched first token): the runs stop there, rather than when the last request finishes, which in a busy
    engine is several horizons later and was most of a forecast's cost."""
    return state.now + cfg.horizon_s


def _harm(base: Run, run: Run, awaiting: dict[str, float], ids: tuple[str, ...], offset_s: float,
          cfg: ForecastConfig, step_s: float) -> Harm:
    """Compare the two runs over `ids` (sorted: the order the sums are taken in); `awaiting` holds the arrival
    of those still without a first token. Token gaps are compared over the window both runs cover, from their
    sums (`Run.window`: count, first, last, gaps past the ITL SLO), which give the mean and whether the p95 is
    past the SLO without a pass over the times. A request is slowed when its TTFT or mean gap with the
    candidate is `slowed_ratio` times the one without, taken as at least `step_s` (one step: 1 ms made 2 ms
    is a rounding of the clock, not harm)."""
    ttft_sum = ttft_max = itl_sum = itl_max = 0.0
    ttft_pushed = itl_pushed = slowed = 0
    ratio = cfg.slowed_ratio
    by_request: list[tuple[str, float]] = []
    for rid in ids:
        arrival = awaiting.get(rid)
        before, after = base.first_token.get(rid), run.first_token.get(rid)
        if arrival is not None and before is not None and after is not None:
            extra = max(after - before, 0.0)
            if extra > 0:
                by_request.append((rid, extra))
            ttft_sum += extra
            ttft_max = max(ttft_max, extra)
            ttft_pushed += before - arrival + offset_s < cfg.ttft_slo_s <= after - arrival + offset_s
            hit = extra > 0 and after - arrival + offset_s >= ratio * max(before - arrival + offset_s, step_s)
        else:
            hit = False
        was, now = base.window.get(rid), run.window.get(rid)
        if was is not None and now is not None and was[0] >= 2 and now[0] >= 2 and was != now:  # equal: no harm
            gap = _mean_gap(now)
            extra = max(gap - _mean_gap(was), 0.0)
            itl_sum += extra
            itl_max = max(itl_max, extra)
            hit = hit or (extra > 0 and gap >= ratio * max(_mean_gap(was), step_s))
            if not _p95_over(was) and _p95_over(now):  # one already past the SLO is not pushed
                itl_pushed += 1
        slowed += hit
    return Harm(len(ids), ttft_sum, ttft_max, itl_sum, itl_max, ttft_pushed, itl_pushed, tuple(by_request),
                slowed)


def _mean_gap(w: Window) -> float:
    """The mean gap between a request's token times in the window: (last - first) / (count - 1)."""
    return (w[2] - w[1]) / (w[0] - 1)


def _p95_over(w: Window) -> bool:
    """Whether the 95th percentile of the n gaps in the window (the gap at rank k = floor(0.95 n) of the sorted
    gaps) is past the limit the run counted them against: it is when at least n - k gaps are."""
    n = int(w[0]) - 1
    return w[3] >= n - min(n - 1, int(0.95 * n))


@dataclass(frozen=True)
class ForecastSettings:
    """What the agent's forecast endpoint and gauge use: the SLOs and horizon, and the reference whale whose
    harm the gauge reports."""

    config: ForecastConfig = ForecastConfig()
    reference: Candidate = Candidate(4096, 512)
