"""Admission forecast: what admitting a request now would cost the requests already on the engine.

Pure: an engine state in (who runs and who waits, with their tokens so far, the KV pool, the token budget),
a forecast out. The near future is re-run twice through the same vLLM scheduling rules the attribution uses
(`sim_step.schedule_step`, priced by the fitted step-cost model), from the state as it is, with and without
the candidates; the difference, request by request, is the harm. Requests expected to arrive meanwhile (a
rate and a typical size, learnt from recent arrivals or declared by the caller) are run too, since a whale
mostly hurts those that come after it: the two are reported apart.
"""

from __future__ import annotations

import bisect
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from attrib_agent.attribution.forecast_sim import Run, simulate_from
from attrib_agent.attribution.forecast_types import ArrivalLoad, Candidate, EngineState, InFlight
from attrib_agent.attribution.sim_step import blocks_for
from attrib_agent.attribution.sim_types import SimRequest, StepCost
from attrib_agent.attribution.slo import SloConfig

__all__ = ["ArrivalLoad", "Candidate", "EngineState", "Forecast", "ForecastConfig", "ForecastSettings", "Harm",
           "InFlight", "Run", "base_run", "forecast"]

CANDIDATE_PREFIX = "candidate-"
EXPECTED_PREFIX = "expected-"
SMALL_GAPS = 256  # token-gap lists shorter than this are counted in plain Python (numpy costs more there)


@dataclass(frozen=True)
class ForecastConfig:
    ttft_slo_s: float = SloConfig().ttft_s  # the goodput budgets (seed 002's: TTFT < 5 s, ITL p95 < 250 ms)
    itl_p95_slo_s: float = SloConfig().itl_s
    horizon_s: float = 10.0  # expected arrivals are run over this much of the future
    max_expected: int = 64  # ... at most this many (bounds the forecast's cost)
    max_steps: int = 20_000  # per simulated run
    harmless_s: float = 0.05  # summed extra TTFT below this calls a candidate harmless

    def __post_init__(self) -> None:
        if min(self.ttft_slo_s, self.itl_p95_slo_s, self.horizon_s) <= 0 or self.max_expected < 0:
            raise ValueError("SLOs and horizon_s must be > 0, max_expected >= 0")
        if self.max_steps < 1 or self.harmless_s < 0:
            raise ValueError("max_steps must be >= 1 and harmless_s >= 0")


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

    def as_dict(self) -> dict[str, float | int]:
        return {"requests": self.requests, "ttft_extra_sum_s": self.ttft_extra_sum_s,
                "ttft_extra_max_s": self.ttft_extra_max_s, "itl_extra_sum_s": self.itl_extra_sum_s,
                "itl_extra_max_s": self.itl_extra_max_s, "ttft_slo_pushed": self.ttft_slo_pushed,
                "itl_slo_pushed": self.itl_slo_pushed}


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

    @property
    def ttft_extra_sum_s(self) -> float:
        return self.in_flight.ttft_extra_sum_s + self.expected.ttft_extra_sum_s

    def harmless(self, config: ForecastConfig) -> bool:
        return self.ttft_extra_sum_s < config.harmless_s and not self.in_flight.itl_slo_pushed

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
                "extra_preemptions": self.preemptions}


def expected_arrivals(state: EngineState, config: ForecastConfig) -> list[SimRequest]:
    """The arrivals the load predicts within the horizon."""
    load = state.load
    if load is None or load.rate_per_s <= 0:
        return []
    gap = 1.0 / load.rate_per_s
    first = 0.5 * gap if load.first_in_s is None else load.first_in_s
    n = min(config.max_expected, max(int((config.horizon_s - first) / gap) + 1, 0))
    shared = load.cached_prefix_tokens
    return [SimRequest(f"{EXPECTED_PREFIX}{i}", state.now + first + i * gap, p, m,
                       EXPECTED_PREFIX if shared else None, min(shared, p - 1))
            for i, (p, m) in ((i, load.size(i)) for i in range(n))]


def base_run(state: EngineState, cost: StepCost, config: ForecastConfig | None = None) -> Run:
    """The future without any candidate: what every candidate's run is compared with. It depends on the state,
    the cost model and the config only, so a caller forecasting many candidates from one state runs it once."""
    cfg = config or ForecastConfig()
    expected = expected_arrivals(state, cfg)
    watch = {r.request_id for r in state.requests} | {r.request_id for r in expected}
    until = window_end(state, cfg)
    run = simulate_from(state, cost, [(r, 0) for r in expected], watch, cfg.max_steps, until=until)
    for rid in watch:  # every candidate compares with these: ranked here, with the snapshot, not per request
        ts = _upto(run.tokens.get(rid, []), until)
        if len(ts) >= 2:
            _gaps(run, rid, ts, until, cfg.itl_p95_slo_s)
    return run


def forecast(state: EngineState, candidates: Sequence[Candidate], cost: StepCost,
             config: ForecastConfig | None = None, base: Run | None = None) -> list[Forecast]:
    """One forecast per candidate, each admitted alone now; the future without any is run once for all (or
    taken from `base`, `base_run` of the same state, cost and config)."""
    cfg = config or ForecastConfig()
    expected = expected_arrivals(state, cfg)
    others = {r.request_id for r in state.requests}
    watch = others | {r.request_id for r in expected}
    if base is None:
        base = base_run(state, cost, cfg)
    out = []
    for c in candidates:
        cid = f"{CANDIDATE_PREFIX}0"
        cand = SimRequest(cid, state.now, c.prompt_tokens, c.max_tokens)
        usable = state.sched.num_blocks - 1
        refused = blocks_for(c.prompt_tokens + c.max_tokens - 1, state.sched.block_size) > usable
        run = simulate_from(state, cost, [(cand, c.cached_prefix_tokens),
                                          *((r, 0) for r in expected)],
                            watch | {cid}, cfg.max_steps, first_token_only=frozenset({cid}),
                            until=window_end(state, cfg))
        first = run.first_token.get(cid)
        admitted = cid in run.first_members
        reason = None if admitted or refused else (
            run.first_stop if run.first_blocked == cid or run.first_stop in ("budget", "seats", "preemption")
            else "queue")
        arrivals = {r.request_id: r.arrival_ts for r in expected}
        until = window_end(state, cfg)
        out.append(Forecast(
            c, refused, admitted, reason,
            None if first is None else first - state.now + state.ttft_offset_s,
            _harm(base, run, {r.request_id: r.arrival_ts for r in state.requests if r.first_token_ts is None},
                  others, state.ttft_offset_s, cfg, until),
            _harm(base, run, arrivals, set(arrivals), state.ttft_offset_s, cfg, until),
            state.load, max(run.preemptions - base.preemptions, 0)))
    return out


def window_end(state: EngineState, cfg: ForecastConfig) -> float:
    """The end of the window ITL and preemptions are compared over (TTFTs are followed past it to the last
    watched first token): the runs stop there, rather than when the last request finishes, which in a busy
    engine is several horizons later and was most of a forecast's cost."""
    return state.now + cfg.horizon_s


def _harm(base: Run, run: Run, awaiting: dict[str, float], ids: set[str], offset_s: float,
          cfg: ForecastConfig, until: float) -> Harm:
    """Compare the two runs over `ids`; `awaiting` holds the arrival of those still without a first token. Token
    gaps are compared up to `until` (both runs cover it)."""
    ttft_sum = ttft_max = itl_sum = itl_max = 0.0
    ttft_pushed = itl_pushed = 0
    by_request: list[tuple[str, float]] = []
    for rid in sorted(ids):
        arrival = awaiting.get(rid)
        before, after = base.first_token.get(rid), run.first_token.get(rid)
        if arrival is not None and before is not None and after is not None:
            extra = max(after - before, 0.0)
            if extra > 0:
                by_request.append((rid, extra))
            ttft_sum += extra
            ttft_max = max(ttft_max, extra)
            ttft_pushed += before - arrival + offset_s < cfg.ttft_slo_s <= after - arrival + offset_s
        before_ts, after_ts = _upto(base.tokens.get(rid, []), until), _upto(run.tokens.get(rid, []), until)
        if len(before_ts) >= 2 and len(after_ts) >= 2 and after_ts != before_ts:  # equal: no extra, none pushed
            mean_before, over_before = _gaps(base, rid, before_ts, until, cfg.itl_p95_slo_s)
            extra = max(_mean_gap(after_ts) - mean_before, 0.0)
            itl_sum += extra
            itl_max = max(itl_max, extra)
            if not over_before and _p95_over(after_ts, cfg.itl_p95_slo_s):  # one already past it is not pushed
                itl_pushed += 1
    return Harm(len(ids), ttft_sum, ttft_max, itl_sum, itl_max, ttft_pushed, itl_pushed, tuple(by_request))


def _gaps(base: Run, rid: str, ts: list[float], until: float, limit: float) -> tuple[float, bool]:
    """The mean token gap of `rid` in the run without a candidate, up to `until`, and whether its p95 gap is past
    `limit`: kept on the run, which every candidate of a snapshot is compared with (`base_run` fills it)."""
    key = (rid, until, limit)
    got = base.gaps.get(key)
    if got is None:
        got = base.gaps[key] = (_mean_gap(ts), _p95_over(ts, limit))
    return got


def _upto(ts: list[float], until: float) -> list[float]:
    """The token times at or before `until` (they are ascending)."""
    return ts if not ts or ts[-1] <= until else ts[:bisect.bisect_right(ts, until)]


def _mean_gap(ts: list[float]) -> float:
    return (ts[-1] - ts[0]) / (len(ts) - 1)


def _p95_over(ts: list[float], limit: float) -> bool:
    """Whether the 95th percentile of the gaps between token times (the gap at rank k = floor(0.95 n) of the n
    sorted gaps) is past `limit`: it is when at least n - k gaps are, so the gaps are counted, not ranked (the
    same subtractions; plain Python below SMALL_GAPS gaps, where numpy's call overhead is most of the cost)."""
    n = len(ts) - 1
    need = n - min(n - 1, int(0.95 * n))
    if n < SMALL_GAPS:
        over = 0
        for a, b in zip(ts, ts[1:], strict=False):
            if b - a > limit:
                over += 1
        return over >= need
    return int(np.count_nonzero(np.diff(np.asarray(ts)) > limit)) >= need


@dataclass(frozen=True)
class ForecastSettings:
    """What the agent's forecast endpoint and gauge use: the SLOs and horizon, and the reference whale whose
    harm the gauge reports."""

    config: ForecastConfig = ForecastConfig()
    reference: Candidate = Candidate(4096, 512)
