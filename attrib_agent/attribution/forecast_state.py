"""The engine state a forecast starts from, read off the pipeline's timeline at its latest event time.

Pure: no clock, the time is the pipeline's last event. Running requests are the members of the last engine
step (tokens in KV from the step, prompt from the log or the inferred prefill); waiting ones arrived and were
not scheduled yet (or were preempted), those vLLM received but has not added to the engine yet among them.
What an observer cannot see is estimated, and said so:
- remaining output: `max_tokens - outputs` when the `Received request` line gave max_tokens (an upper bound:
  a request may stop early at EOS), else the median completion length of recent finished requests, else
  `default_output_tokens`;
- a request's prompt before its prefill has shown it: the median prompt of the requests that asked for the same
  max_tokens (`prompt_classes`: this agent's, else the last agent's on this engine, kept in the saved state),
  else the median prompt of recent requests, else `default_prompt_tokens`;
- expected arrivals: the arrivals of the last `load_window_s` as a rate (those after the first over the span
  from it), with their median prompt and max_tokens; before this agent has seen two arrivals, the load the last
  agent saw on this engine (kept in the saved state, agent/fit_store.py): a restarted sidecar's whale otherwise
  comes before any traffic it knows of.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Protocol

from attrib_agent.attribution.attributor import Attributor
from attrib_agent.attribution.cost_model import PriceRange, StepCostModel, StepFeatures, prefill_pairs
from attrib_agent.attribution.fit_snapshot import EngineWatch
from attrib_agent.attribution.forecast import ArrivalLoad, EngineState, InFlight
from attrib_agent.attribution.sim_cache import FrozenCost
from attrib_agent.timeline.engine_timeline import EngineTimeline
from attrib_agent.timeline.model import RequestLifecycle, StepRecord


class PipelineParts(Protocol):
    """What the state is read from: the pipeline's timeline and attributor at its latest event time (the
    pipeline sits above this layer, so it is named by shape)."""

    @property
    def last_event_ts(self) -> float | None: ...

    @property
    def timeline(self) -> EngineTimeline: ...

    @property
    def attributor(self) -> Attributor: ...

    @property
    def engine_watch(self) -> EngineWatch: ...


@dataclass(frozen=True)
class StateConfig:
    default_output_tokens: int = 256
    default_prompt_tokens: int = 512
    load_window_s: float = 30.0  # arrivals this recent make the expected load
    min_load_span_s: float = 1.0  # a rate is never taken over less than this (one arrival is not 1000/s)
    max_requests: int = 512  # in-flight requests kept in a state (the oldest first); bounds a forecast's cost
    max_prompt_classes: int = 16  # max_tokens values whose median prompt is kept (the most asked for first)

    def __post_init__(self) -> None:
        if min(self.default_output_tokens, self.default_prompt_tokens, self.max_requests,
               self.max_prompt_classes) < 1:
            raise ValueError("default token counts, max_requests and max_prompt_classes must be >= 1")
        if self.load_window_s <= 0 or self.min_load_span_s <= 0:
            raise ValueError("load_window_s and min_load_span_s must be > 0")


def engine_state(pipeline: PipelineParts, config: StateConfig | None = None,
                 load: ArrivalLoad | None = None, prompts: Mapping[str, int] | None = None) -> EngineState | None:
    """The state at the pipeline's latest event time (None before any event). `load` overrides the learnt one;
    `prompts` gives prompt lengths the caller knows (a router knows what it sent) for requests whose prefill
    has not shown them yet."""
    cfg = config or StateConfig()
    now = pipeline.last_event_ts
    if now is None:
        return None
    tl = pipeline.timeline
    outcomes = tl.outcomes()
    last = outcomes[-1][1].record if outcomes else None
    members = {m.request_id: m for m in last.members} if last is not None else {}
    # a request vLLM received but has not added yet (its front end renders it: ~1 ms) is ahead of the candidate
    # all the same: whale2-b4096's s002, received 0.2 ms before w2 and admitted with w2's first chunk
    lcs = [lc for lc in (*tl.lifecycles(), *tl.received(now)) if lc.arrival_ts is not None and lc.arrival_ts <= now]
    done = [lc for lc in lcs if lc.complete]
    prompt_guess = _median([lc.prompt_tokens for lc in lcs if lc.prompt_tokens], cfg.default_prompt_tokens)
    classes = prompt_classes(lcs, cfg.max_prompt_classes, pipeline.engine_watch.prompts)
    output_guess = _median([lc.completion_tokens for lc in done if lc.completion_tokens], cfg.default_output_tokens)
    live = sorted((lc for lc in lcs if not lc.complete and lc.end_ts is None),
                  key=lambda lc: (lc.arrival_ts or 0.0, lc.request_id))[: cfg.max_requests]
    running: list[tuple[float, InFlight]] = []
    preempted: list[tuple[float, InFlight]] = []
    waiting: list[InFlight] = []
    known = prompts or {}
    for lc in live:
        if lc.prompt_tokens is None and lc.request_id in known:
            lc = replace(lc, prompt_tokens=max(int(known[lc.request_id]), 1))
        arrival = lc.arrival_ts if lc.arrival_ts is not None else now
        m = members.get(lc.request_id)
        guess = classes.get(lc.max_tokens, prompt_guess) if lc.max_tokens is not None else prompt_guess
        if m is not None:
            prompt = lc.prompt_tokens or max(guess, m.context_tokens + (m.phase == "prefill"))
            outputs = max(m.context_tokens - prompt + 1, 0) if m.phase != "prefill" or m.context_tokens >= prompt else 0
            first = lc.first_token_ts if lc.first_token_ts is not None else (now if outputs else None)
            req = InFlight(lc.request_id, arrival, prompt, m.context_tokens, outputs,
                           _remaining(lc, outputs, output_guess), True, first)
            running.append((lc.scheduled_ts if lc.scheduled_ts is not None else arrival, req))
            continue
        prompt = lc.prompt_tokens or guess
        req = InFlight(lc.request_id, arrival, prompt, 0, 0, _remaining(lc, 0, output_guess), False, None)
        if lc.scheduled_ts is not None:  # scheduled before, not in the last step: preempted, front of the queue
            preempted.append((lc.scheduled_ts, req))
        else:
            waiting.append(req)
    ordered = [r for _, r in sorted(running, key=lambda x: x[0])]
    ordered += [r for _, r in sorted(preempted, key=lambda x: x[0])] + waiting
    basis = "declared"
    if load is None:  # learnt; the part of the window before this agent's first arrival as the last agent saw it
        saved = pipeline.engine_watch.arrivals
        load = learnt_load(lcs, now, cfg, tl.cached_tokens, saved)
        basis = "saved" if not lcs else "learnt" if saved is None or _covered(lcs, now, cfg) >= 1 else "learnt+saved"
    return EngineState(now, pipeline.attributor.scheduler_config(tl), tuple(ordered), load,
                       pipeline.attributor.frontend_offsets()[0], tl.engine, basis)


class ScaledCost:
    """The step-cost model's figures times a factor (a StepCost and PrefillAwareStepCost): its coefficients frozen
    and scaled once (`FrozenCost`, the model's formula written once), since the simulator prices every step
    through it; `cost` and `factor` say what it was made from. `gap_s`, when given, is the gap between steps in
    place of the scaled model's (`forecast_cost`: measured, not fitted). `shape`, when given, is the prefill's
    per-token, per-pair and per-request prices in place of the model's (`prior_shape`), before the factor."""

    __slots__ = ("cost", "factor", "gap_s", "prefill", "price_range", "shape", "step_seconds",
                 "step_seconds_with_prefill")
    step_seconds: Callable[[int, int, int], float]
    step_seconds_with_prefill: Callable[..., float]
    price_range: PriceRange

    def __init__(self, cost: StepCostModel, factor: float, gap_s: float | None = None,
                 prefill: float = 1.0, shape: tuple[float, float, float] | None = None) -> None:
        prices = FrozenCost.of(cost, factor)
        if gap_s is not None:
            prices = replace(prices, gap_s=gap_s)
        if shape is not None:
            prices = replace(prices, b=factor * shape[0], e=factor * shape[1], f=factor * shape[2])
        if prefill != 1.0:
            prices = replace(prices, b=prices.b * prefill, e=prices.e * prefill, f=prices.f * prefill)
        self.cost, self.factor, self.gap_s, self.prefill, self.shape = cost, factor, prices.gap_s, prefill, shape
        self.price_range = cost.price_range  # scaling moves the prices, not the evidence they rest on
        self.step_seconds, self.step_seconds_with_prefill = prices.step_seconds, prices.step_seconds_with_prefill


def forecast_cost(pipeline: PipelineParts, max_steps: int = 64, gap_steps: int = 1024) -> StepCostModel | ScaledCost:
    """The step-cost model scaled to the machine's pace now: by the ratio of the observed to the predicted time
    of the last `max_steps` steps (summed, so the long steps, prefill chunks, weigh as much as the time they
    take). The fit spans ~1,000 steps and the engine's kept long chunks, so it prices the machine's average;
    the steps of the last second or so say how fast it runs now (a GPU shared with another tenant, a throttled
    clock, a CPU host under load), and a whale admitted now runs at that pace. On the continuous truth the last
    64 steps before w1 ran 0.8-2.9 times the fit and its own prefill 0.8-3.1 times (r2: 2.9 and 3.1). Before
    the fit (a fresh agent), the same ratio scales the prior, so that a machine five times faster than the
    prior's is not forecast five times too slow from its first steps on. No step seen: the model as it is.

    The gap between steps (vLLM's work from one step's end to the next's start) is measured, `step_gap`: the
    elapsed fit is fed no gaps, so its gap is the prior's 1.5 ms plus the fit's residual mean, and a forecast
    adds it to every simulated step. The lab's machines ran 0.5-5 ms (preempt's decode steps: 0.6 ms, so its
    800-token whales' decode was priced 1.4x its time)."""
    cost = pipeline.attributor.cost
    gap = cost.coefficients.step_gap_s
    observed = predicted = 0.0
    outcomes = pipeline.timeline.outcomes()
    for _, out in outcomes[-max_steps:]:
        f = StepFeatures.from_record(out.record)
        predicted += cost.step_seconds_with_prefill(f.prefill_tokens, f.decode_requests, f.decode_context_sum,
                                                    f.prefill_pairs, f.prefill_requests) - gap
        observed += out.record.elapsed_s
    factor = observed / predicted if observed > 0 and predicted > 0 else None
    measured = last_gap(pipeline, gap_steps)
    shape = prior_shape(cost, pipeline.timeline.token_budget())
    # no step of this run to read the pace from (a restarted agent before its first step): the fit's own
    # prefill evidence corrects its chunk price; once the pace is measured, the pace is the better figure
    chunks = prefill_factor(cost) if factor is None and cost.fitted and shape is None else None
    if factor is None and measured is None and chunks is None and shape is None:
        return cost
    k = 1.0 if factor is None else factor
    # the fit's gap is the prior's plus its residual mean (a compute figure, scaled): the prior's part measured
    return ScaledCost(cost, k, None if measured is None else max(k * (gap - cost.prior.step_gap_s) + measured, 0.0),
                      1.0 if chunks is None else chunks, shape)


def prior_shape(cost: StepCostModel, token_budget: int) -> tuple[float, float, float] | None:
    """The prefill's prices (per token, per attention pair, per request) for a fit that has never read a full
    chunk (`token_budget` tokens): the prior's, times the machine's pace against the prior on the steps the fit
    did read (`StepCostModel.prior_pace`); None when the fit covers such a chunk (or is the prior itself). A fit
    whose prefill steps were all short cannot tell a token's price from a request's or an attention pair's (32-token
    prompts: the three move together) nor see attention over a long context (1,024-token prompts priced a
    2,048-token chunk's pairs at 0), so its split of the prefill's cost says nothing of a whale's chunk: measured on
    the nine truths' kept fits, 2.3-2.9x dear from 32-token windows, 0.5x from a 1,024-token one. The prior's
    proportions are the hardware's as configured; its absolute level is a machine's, and the pace rescales it."""
    budget = max(token_budget, 1)
    if not cost.fitted or cost.price_range.covers(budget, prefill_pairs(0, budget)):
        return None
    p, k = cost.prior, cost.prior_pace
    return k * p.per_prefill_token_s, k * p.per_prefill_pair_s, k * p.per_prefill_request_s


def prefill_factor(cost: StepCostModel) -> float | None:
    """How much longer the prefill steps the fit reads took than it prices their prefill part: their time beyond
    the other terms, summed, over their prefill terms (tokens, pairs, requests), summed. The fit is robust over
    ~1,000 mostly-decode steps, so a whale's few long chunks are down-weighted as outliers and priced low
    (preempt-midstream's second chunks 0.75-1.38 s, priced 0.64-0.95 s). A ratio of sums, as `forecast_cost`'s
    pace: whoever queues behind a prefill waits for the sum of its chunks, and on a host whose chunks sometimes
    stall (preempt-midstream's second chunk 0.53-2.36 s) the expected sum is the mean's. The weighted median this
    was until the eleventh session priced the typical chunk: preempt-midstream/w1's at 0.90x and 0.79x of what
    they took in r1 and r2 (1.26x and 1.03x by the ratio). None with no prefill step."""
    a, b, c, d, e, f = cost.coefficients.as_tuple()
    took = priced_sum = 0.0
    for row, y in cost.prefill_steps():
        priced = b * row[1] + e * row[4] + f * row[5]
        if priced > 0:
            took += y - a - c * row[2] - d * row[3]
            priced_sum += priced
    return took / priced_sum if priced_sum > 0 and took > 0 else None


def last_gap(pipeline: PipelineParts, steps: int = 1024) -> float | None:
    """The gap between steps as measured over the last `steps` (`step_gap`); until there are enough, the one the
    last agent on this engine measured (kept in the saved state: a whale may come before a step is seen)."""
    cost = pipeline.attributor.cost
    outcomes = pipeline.timeline.outcomes()[-steps:]
    seen = step_gap((out.record for _, out in outcomes), cost.max_step_gap_s, cost.min_steps)
    return seen if seen is not None else pipeline.engine_watch.step_gap_s


def step_gap(steps: Iterable[StepRecord], max_gap_s: float, min_gaps: int) -> float | None:
    """The mean gap between steps run back to back (the next one starting within `max_gap_s` of the last one's
    end, the cost model's rule for a gap that is not idleness): None with fewer than `min_gaps` of them."""
    total, n, last_end = 0.0, 0, None
    for r in steps:
        end = r.end_ts
        if last_end is not None:
            g = end - r.elapsed_s - last_end  # its start_ts, inlined: once per step of the window, per settle
            if -max_gap_s <= g <= max_gap_s:
                total += g
                n += 1
        last_end = end
    return total / n if n >= min_gaps and n else None


def learnt_load(lcs: list[RequestLifecycle], now: float, cfg: StateConfig,
                cached: Callable[[str], int] | None = None, prior: ArrivalLoad | None = None) -> ArrivalLoad | None:
    """Recent arrivals as an evenly spaced stream of their median size, and the median of the prompt tokens they
    found in the prefix cache (`cached`, by request id: a shared system prompt or document) as the stream's
    shared prefix; None with fewer than two (one arrival says nothing of a rate). The rate is that of the
    arrivals after the first over the span from it to now: the watch starts at the first, so n arrivals are
    n - 1 gaps' worth (n / span, the rate until the twelfth session, read kvpair's 4 shorts 0.5 s apart as
    2.7/s, not 2/s). Their sizes in turn (a mix) were tried: with a few arrivals seen, one whale among them is
    then expected every few arrivals (whale2/w2's learnt forecast went from 0.9 s to 46 s against 0.69 s); the
    median ignores a rare whale.

    `prior`: the load the last agent on this engine saw (its saved state). The part of the window before this
    agent's first arrival is filled with it, as `prior.rate_per_s` times that span arrivals of its sizes: a
    restarted agent that has seen two whales in 0.1 s does not expect whales at 2/s (preempt/w3, whose learnt
    forecast was 0.28 s against 10.77 s: the previous run's short stream is the better evidence until this
    agent has watched a window of its own)."""
    since = now - cfg.load_window_s
    recent = [lc for lc in lcs if lc.arrival_ts is not None and since <= lc.arrival_ts <= now]
    weight = 0.0 if prior is None else prior.rate_per_s * cfg.load_window_s * (1.0 - _covered(lcs, now, cfg))
    if weight <= 0.0 and len(recent) < 2:
        return None
    prompts = [(float(lc.prompt_tokens), 1.0) for lc in recent if lc.prompt_tokens]
    outs = [(float(lc.max_tokens or lc.completion_tokens or 0), 1.0) for lc in recent
            if lc.max_tokens or lc.completion_tokens]
    shares = [(float(cached(lc.request_id)), 1.0) for lc in recent] if cached is not None else []
    if weight > 0.0 and prior is not None:
        prompts.append((float(prior.prompt_tokens), weight))
        outs.append((float(prior.max_tokens), weight))
        shares.append((float(prior.cached_prefix_tokens), weight))
        rate = (max(len(recent) - 1, 0) + weight) / cfg.load_window_s
    else:
        first = min(lc.arrival_ts for lc in recent if lc.arrival_ts is not None)
        rate = (len(recent) - 1) / max(now - first, cfg.min_load_span_s)
    return ArrivalLoad(rate, _weighted_median(prompts, cfg.default_prompt_tokens),
                       _weighted_median(outs, cfg.default_output_tokens),
                       cached_prefix_tokens=_weighted_median(shares, 0))


def prompt_classes(lcs: Iterable[RequestLifecycle], limit: int,
                   prior: Mapping[int, int] | None = None) -> dict[int, int]:
    """The median prompt of the requests whose prompt is known, by the max_tokens they asked for: the guess for a
    request vLLM has received but not yet shown the prompt of (its `Received request` line gives max_tokens, not
    the prompt). Clients ask for max_tokens by use (a chat turn, a summary of a document), so a request asking
    what another asked for is likely of its kind: preempt/w3 arrives behind two 3,900-token whales, one waiting,
    one a chunk into its prefill, that the all-requests median (or default) guessed 512 and 2,049 tokens, and its
    forecast was 0.08 s against a true 10.6 s. Where every request asks for the same max_tokens (a client's
    default), this is the median of them all, as before. `prior`: the last agent's on this engine (saved state),
    for the values this agent has not seen a prompt of; at most `limit` values, this agent's most asked for first."""
    seen: dict[int, list[int]] = {}
    for lc in lcs:
        if lc.prompt_tokens and lc.max_tokens:
            seen.setdefault(lc.max_tokens, []).append(lc.prompt_tokens)
    top = sorted(seen.items(), key=lambda kv: (-len(kv[1]), kv[0]))[:limit]
    out = {k: int(statistics.median(v)) for k, v in top}
    for k, v in (prior or {}).items():
        if len(out) >= limit:
            break
        out.setdefault(k, v)
    return out


def last_prompts(pipeline: PipelineParts, config: StateConfig | None = None) -> dict[int, int]:
    """The prompt classes to save (`prompt_classes` over the timeline's requests, the saved ones after)."""
    cfg = config or StateConfig()
    return prompt_classes(pipeline.timeline.lifecycles(), cfg.max_prompt_classes, pipeline.engine_watch.prompts)


def _covered(lcs: list[RequestLifecycle], now: float, cfg: StateConfig) -> float:
    """The share of the load window this agent has watched: from its first arrival on (1: all of it)."""
    first = min((lc.arrival_ts for lc in lcs if lc.arrival_ts is not None), default=None)
    return 0.0 if first is None else min(max(now - first, 0.0) / cfg.load_window_s, 1.0)


def _weighted_median(xs: list[tuple[float, float]], default: int) -> int:
    """The median of values with weights (equal weights: `statistics.median`, the mean of the middle two)."""
    if not xs:
        return default
    if all(w == 1.0 for _, w in xs):
        return int(statistics.median(v for v, _ in xs))
    xs = sorted(xs)
    half, acc = sum(w for _, w in xs) / 2, 0.0
    for v, w in xs:
        acc += w
        if acc >= half:
            return int(v)
    return int(xs[-1][0])


def last_load(pipeline: PipelineParts, config: StateConfig | None = None) -> ArrivalLoad | None:
    """The traffic last seen, for the saved state: the learnt load as it was at the latest arrival (an agent
    saving at exit, after its traffic stopped, keeps the load it had, not an idle minute's); else the one it
    was given at start (a restart that saw nothing passes its predecessor's on)."""
    cfg = config or StateConfig()
    tl = pipeline.timeline
    lcs = [lc for lc in tl.lifecycles() if lc.arrival_ts is not None]
    last = max((lc.arrival_ts for lc in lcs if lc.arrival_ts is not None), default=None)
    saved = pipeline.engine_watch.arrivals
    seen = learnt_load(lcs, last, cfg, tl.cached_tokens, saved) if last is not None else None
    return seen if seen is not None else saved


def _remaining(lc: RequestLifecycle, outputs: int, guess: int) -> int:
    if lc.max_tokens is not None:
        return max(lc.max_tokens - outputs, 0)
    return max(guess - outputs, 1)


def _median(xs: list[int], default: int) -> int:
    return int(statistics.median(xs)) if xs else default
