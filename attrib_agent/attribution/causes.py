"""Causes by mechanism: through what each culprit slowed a victim, read from the engine steps the timeline saw.

The Shapley split decides *how much* each culprit is blamed; this module labels those seconds, per phase (TTFT,
ITL), with what happened to the victim in each observed step it was in flight (docs/attribution.md, "Causes"):
- preempted (timeline/preemption.py saw it): from the step it was dropped until it had recomputed what it held,
  `preemption`, on the requests holding the KV at that step (by blocks: their growth made vLLM preempt it);
- queued while the pool could not take the queue's head: `kv_pressure` on the holders by blocks, and when the
  head was another request, `head_of_line` on that request. Blocks are a holder's exclusive ones (what removing
  it alone frees; a shared prefix is nobody's alone) and the pool's free blocks count each shared block once
  (timeline/kv_share.py);
- queued with room but the token budget full: `prefill_contention` on the chunks that filled it;
- running (or arriving mid-step): the step's time less the victim's own share of the step's price, by what each
  other member adds to the step's *period* (the victim's inter-token time: attribution/period_cost.py):
  `prefill_contention` for chunks, `decode_batching` for decodes, and `kv_bandwidth` for the part that is their
  context's memory traffic, taken from NVML's measured DRAM bandwidth when the GPU reports it.
A culprit's seconds in a phase are split by its own weights there (or, when it has none, e.g. it acted only by
being there in a counterfactual, by the victim's overall weights). Without observed steps, the simulated
trace's waits are used instead (`simulated`).
"""

from __future__ import annotations

import bisect
from collections import defaultdict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from attrib_agent.attribution.result import NO_CAUSES, NO_EVIDENCE, Cause, Evidence
from attrib_agent.attribution.sim_trace import Member, Pricer, StepPrices
from attrib_agent.attribution.sim_types import SchedulerConfig, SimOutcome
from attrib_agent.timeline.engine_timeline import EngineTimeline
from attrib_agent.timeline.gpu_samples import GpuSamples
from attrib_agent.timeline.model import RequestLifecycle, StepMember, StepRecord
from attrib_agent.timeline.preemption import InferredPreemption
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome

PHASES = ("ttft", "itl")
_STEP_EPS_S = 0.0005  # log times are stamped to the millisecond
_HELD_LOOKBACK = 64  # steps scanned back from a preemption for the victim's last step (it ran in the one before)
_Weights = dict[str, dict[str, dict[str, float]]]  # phase -> culprit -> cause -> seconds
_StepKey = tuple[int, float]  # (iteration, end): iterations restart with vLLM
_NOTHING_SHARED: tuple[Mapping[str, int], int] = ({}, 0)
_BY_ARRIVAL = attrgetter("arrival_ts", "request_id")  # of lifecycles with an arrival
_POSITIVE = (0.0).__lt__  # `v > 0` as a C predicate (False for NaN too)


@dataclass(eq=False)
class EngineView:
    """What the cause computation reads of one engine (its steps sorted by end, requests, preemptions, pool),
    built once per attribution pass and shared by its victims (the queue's head per step is cached)."""

    steps: Sequence[StepRecord]
    lifecycles: Mapping[str, RequestLifecycle]
    preemptions: Sequence[InferredPreemption]
    pool_blocks: int
    block_size: int
    token_budget: int
    pricer: Pricer  # what each member adds to the step's period (attribution/period_cost.py)
    gpu: GpuSamples | None = None
    # by step, where prefix blocks are shared: each holder's exclusive blocks, and the blocks counted twice
    kv_shared: Mapping[tuple[int, float], tuple[Mapping[str, int], int]] = field(default_factory=dict)
    _ends: list[float] = field(default_factory=list)
    _queue: list[RequestLifecycle] = field(default_factory=list)  # by arrival
    _arrivals: list[float] = field(default_factory=list)
    # by step (iteration, end: iterations restart with vLLM), shared by the pass's victims
    _heads: dict[tuple[int, float], tuple[RequestLifecycle, int | None] | None] = field(default_factory=dict)
    _prices: dict[tuple[int, float], tuple[StepPrices, float | None]] = field(default_factory=dict)
    _contention: dict[tuple[int, float], StepShares] = field(default_factory=dict)
    _kv: dict[tuple[int, float], tuple[dict[str, float], int]] = field(default_factory=dict)
    _max_wait: float = 0.0

    def __post_init__(self) -> None:
        if len(self._ends) != len(self.steps):  # engine_view hands the timeline's kept list; a test builds it here
            self._ends[:] = [s.end_ts for s in self.steps]
        self._queue.extend(sorted([lc for lc in self.lifecycles.values() if lc.arrival_ts is not None],
                                  key=_BY_ARRIVAL))
        self._arrivals.extend([lc.arrival_ts or 0.0 for lc in self._queue])
        last = self._ends[-1] if self._ends else 0.0
        waits = [(lc.scheduled_ts if lc.scheduled_ts is not None else max(lc.end_ts or last, last))
                 - (lc.arrival_ts or 0.0) for lc in self._queue]
        self._max_wait = max(waits, default=0.0)

    def holders(self, step: StepRecord) -> dict[str, float]:
        """The step's members by the KV blocks each holds alone (all it holds where nothing is shared)."""
        return self.kv(step)[0]

    def kv(self, step: StepRecord) -> tuple[dict[str, float], int]:
        """`holders(step)` and the blocks their sum counts twice (a shared prefix), read once per step and pass:
        the victims queued in a step all ask. Callers do not change the dict."""
        key = (step.iteration, step.end_ts)
        got = self._kv.get(key)
        if got is None:
            own, twice = self.kv_shared.get(key, _NOTHING_SHARED)
            got = self._kv[key] = (
                {m.request_id: float(b) for m in step.members if (b := own.get(m.request_id, m.blocks)) > 0}, twice)
        return got

    def between(self, t0: float, t1: float) -> Sequence[StepRecord]:
        """Steps ending after t0 and starting before t1."""
        steps = self.steps
        out = []
        for i in range(bisect.bisect_right(self._ends, t0), len(steps)):  # not a slice: that copies the window's tail
            if (s := steps[i]).start_ts >= t1:
                break
            out.append(s)
        return out

    def uncontended_ttft(self, lc: RequestLifecycle) -> bool:
        """Whether the steps show `lc`'s TTFT free of others' work: no other request's prefill or recompute in a
        step overlapping it, and no wait in vLLM's queue beyond the step already running when it came. Only such a
        request measures the frontend's own time (observed - simulated TTFT); a queued or contended one would teach
        the baseline the interference the simulation missed (docs/attribution.md, "The frontend offset")."""
        t0, t1 = lc.arrival_ts, lc.first_token_ts
        if t0 is None or t1 is None:
            return False
        steps = self.between(t0, t1)
        if not steps:
            return False
        if any(m.request_id != lc.request_id and m.phase != "decode" for s in steps for m in s.members):
            return False
        queued = lc.queue_s or 0.0
        return queued <= max((s.elapsed_s for s in steps if s.start_ts <= t0 + queued), default=0.0) + _STEP_EPS_S

    def seen_ttft(self, lc: RequestLifecycle) -> float | None:
        """The part of `lc`'s TTFT the engine's steps account for: from its arrival to its first token when a step
        was running then, else to the end of the last step before it (the rest, the engine idle, is the
        frontend's). None without steps."""
        t0, t1 = lc.arrival_ts, lc.first_token_ts
        if t0 is None or t1 is None:
            return None
        i = bisect.bisect_left(self._ends, t1)
        if i < len(self.steps) and self.steps[i].start_ts <= t1:
            return max(0.0, t1 - t0)
        return max(0.0, self._ends[i - 1] - t0) if i else None

    def head(self, step: StepRecord) -> tuple[RequestLifecycle, int | None] | None:
        """The request at the front of vLLM's queue when `step` began, with the tokens it held when preempted (None
        if it was not): a preempted one waiting to resume (the latest first: vLLM puts it back in front), else the
        first by arrival not yet scheduled."""
        key = (step.iteration, step.end_ts)
        if key not in self._heads:
            self._heads[key] = self._head(step.start_ts)
        return self._heads[key]

    def held(self, p: InferredPreemption) -> int | None:
        """The tokens `p`'s request held in the last step it ran before it was dropped (what it must recompute)."""
        i = bisect.bisect_left(self._ends, p.preempted_ts)  # the step it was dropped in, or one ending as it began
        i = next((k for k in range(i, min(i + 3, len(self.steps))) if self.steps[k].iteration == p.preempted_iteration),
                 i)
        for s in reversed(self.steps[max(0, i - _HELD_LOOKBACK):i]):
            m = next((m for m in s.members if m.request_id == p.request_id), None)
            if m is not None:
                return m.context_tokens
        return None

    def prices(self, step: StepRecord) -> tuple[StepPrices, float | None]:
        """The step's members priced (marginal costs shared by every victim in it) and the GPU's bandwidth."""
        key = (step.iteration, step.end_ts)
        got = self._prices.get(key)
        if got is None:
            bw = self.gpu.bandwidth(step.start_ts, step.end_ts) if self.gpu is not None else None
            got = self._prices[key] = (StepPrices(self.pricer, [_member(m) for m in step.members]), bw)
        return got

    def contention(self, step: StepRecord) -> StepShares:
        """Each member's marginal cost by cause (decode, prefill or batching seconds, bandwidth seconds) by its id,
        with each cause's sums: the same for every victim in the step but for leaving out its own."""
        key = (step.iteration, step.end_ts)
        got = self._contention.get(key)
        if got is None:
            prices, measured = self.prices(step)
            index: dict[str, tuple[bool, float, float]] = {}
            for m, (marginal, bw) in zip(prices.members, prices.marginals(), strict=True):
                if not m.decode:
                    index[m.request_id] = (False, marginal, 0.0)
                    continue
                if measured is not None and bw > 0:  # the GPU's own figure: the share of the step its DRAM was busy
                    bw = marginal * measured
                index[m.request_id] = (True, marginal - bw, bw)
            got = self._contention[key] = StepShares(index)
        return got

    def _head(self, t: float) -> tuple[RequestLifecycle, int | None] | None:
        stalled = [p for p in self.preemptions if p.preempted_ts <= t + _STEP_EPS_S
                   and (p.resumed_ts is None or p.resumed_ts > t + _STEP_EPS_S)]
        if stalled:  # in the timeline's order: by step, then vLLM's victim order; each goes to the front
            lc = self.lifecycles.get(stalled[-1].request_id)
            if lc is not None:
                return lc, self.held(stalled[-1])
        # nobody waits longer than the longest wait seen: start the scan there
        for lc in self._queue[bisect.bisect_left(self._arrivals, t - self._max_wait - 1.0):]:
            if (lc.arrival_ts or 0.0) >= t:
                return None
            if lc.scheduled_ts is None or lc.scheduled_ts > t + _STEP_EPS_S:
                return lc, None
        return None


class StepShares:
    """One step's members by id (decode, prefill or batching seconds, bandwidth seconds) and, per cause (prefill
    contention, decode batching, kv bandwidth), the sum of all members' parts and of the positive ones: a victim's
    split of the step is those less its own part, so it is worked out per step, not per member (`_contention`)."""

    __slots__ = ("index", "sums", "positive", "counts")

    def __init__(self, index: dict[str, tuple[bool, float, float]]) -> None:
        self.index = index
        pf = bt = bw = pf_pos = bt_pos = bw_pos = 0.0
        n_pf = n_bt = n_bw = 0  # members with a positive part: a sum less the only one is 0, not a rounding
        for decode, part, band in index.values():
            if decode:
                bt += part
                bw += band
                if part > 0:
                    bt_pos += part
                    n_bt += 1
                if band > 0:
                    bw_pos += band
                    n_bw += 1
            else:
                pf += part
                if part > 0:
                    pf_pos += part
                    n_pf += 1
        self.sums = (pf, bt, bw)
        self.positive = (pf_pos, bt_pos, bw_pos)
        self.counts = (n_pf, n_bt, n_bw)


_CONTENTION = (Cause.PREFILL_CONTENTION.value, Cause.DECODE_BATCHING.value, Cause.KV_BANDWIDTH.value)
_HEAD_OF_LINE = Cause.HEAD_OF_LINE.value
_Lazy = tuple[StepShares, str, float, float, float]  # a step's shares, the victim, seconds per unit of each cause


# VictimCauses' empty fields, made by named functions, not lambdas: mypyc (`benchmarks.replay_throughput
# --compiled`) stops with an internal error on a dataclass field whose default factory is a lambda
def _by_cause() -> defaultdict[str, float]:
    return defaultdict(float)


def _no_weights() -> _Weights:
    return {p: defaultdict(_by_cause) for p in PHASES}


def _no_steps() -> dict[str, list[_Lazy]]:
    return {p: [] for p in PHASES}


def _no_sums() -> dict[str, dict[str, float]]:
    return {p: {} for p in PHASES}


@dataclass
class VictimCauses:
    """One victim's mechanism weights, the evidence behind each cause, and the seconds it lost to preemption.

    A step's contention is kept as (the step's shares, one factor per cause) and expanded into a culprit's
    weights only when its blame is split (`split`): a result names a few of the requests its steps held, and the
    victim's overall weights per cause are summed as the steps come (`weights` expands every culprit)."""

    _eager: _Weights = field(default_factory=_no_weights)
    evidence: dict[str, str] = field(default_factory=dict)
    preempted_s: float = 0.0
    _lazy: dict[str, list[_Lazy]] = field(default_factory=_no_steps)
    _lazy_overall: dict[str, dict[str, float]] = field(default_factory=_no_sums)

    def add(self, phase: str, cause: Cause, by: Mapping[str, float], seconds: float, evidence: Evidence) -> None:
        """`seconds` shared out by the weights `by` (any scale); nothing when either is empty."""
        total = sum(filter(_POSITIVE, by.values()))  # the positive weights, in order
        if seconds <= 0 or total <= 0:
            return
        weights, name = self._eager[phase], cause.value
        for rid, w in by.items():
            if w > 0:
                weights[rid][name] += seconds * w / total
        self._saw(name, evidence)

    def _saw(self, name: str, evidence: Evidence) -> None:
        if name not in self.evidence or evidence is Evidence.NVML_BANDWIDTH:
            self.evidence[name] = evidence.value

    def contended(self, phase: str, shares: StepShares, victim: str, seconds: tuple[float, float, float],
                  positive: tuple[float, float, float], evidence: tuple[Evidence, Evidence, Evidence]) -> None:
        """A contention step: `seconds[i]` shared out among the step's members but `victim` by their positive
        parts of cause i (`_CONTENTION`), whose sum without the victim's is `positive[i]`."""
        factors = [0.0, 0.0, 0.0]
        overall = self._lazy_overall[phase]
        for i in range(3):
            if seconds[i] > 0 and positive[i] > 0:
                factors[i] = seconds[i] / positive[i]
                name = _CONTENTION[i]
                overall[name] = overall.get(name, 0.0) + seconds[i]
                self._saw(name, evidence[i])
        if factors[0] or factors[1] or factors[2]:
            self._lazy[phase].append((shares, victim, factors[0], factors[1], factors[2]))

    def culprit(self, phase: str, culprit: str) -> dict[str, float]:
        """`culprit`'s seconds by cause in `phase`."""
        acc = dict(self._eager[phase].get(culprit, {}))
        pc, db, kb = _CONTENTION
        for shares, victim, fp, fb, fw in self._lazy[phase]:
            e = shares.index.get(culprit)
            if e is None or culprit == victim:
                continue
            decode, part, bw = e
            if decode:
                if part > 0 and fb:
                    acc[db] = acc.get(db, 0.0) + fb * part
                if bw > 0 and fw:
                    acc[kb] = acc.get(kb, 0.0) + fw * bw
            elif part > 0 and fp:
                acc[pc] = acc.get(pc, 0.0) + fp * part
        return acc

    @property
    def weights(self) -> _Weights:
        """Every culprit's seconds by cause, per phase (each expanded: for reading the whole, e.g. in tests)."""
        out: _Weights = {}
        for phase in PHASES:
            named = dict.fromkeys(self._eager[phase])
            for shares, victim, *_ in self._lazy[phase]:
                named.update((r, None) for r in shares.index if r != victim)
            out[phase] = {r: by for r in named if (by := {c: s for c, s in self.culprit(phase, r).items() if s > 0})}
        return out

    def split(self, culprit: str, phase: str, seconds: float) -> Mapping[str, float]:
        """`seconds` of `culprit`'s blame in `phase`, by its own causes there (else the victim's overall; `other`
        when no step of the phase shows a wait: blame from the counterfactual runs alone)."""
        if seconds <= 0:
            return NO_CAUSES
        fractions = _normalised(self.culprit(phase, culprit)) or _normalised(self._overall(phase))
        return {c: seconds * f for c, f in sorted(fractions.items())} if fractions else {Cause.OTHER.value: seconds}

    def evidence_for(self, *causes: Mapping[str, float], comembership: Collection[str] = ()) -> Mapping[str, str]:
        """What each named cause rests on; `observed_comembership` for those (`comembership`) labelling seconds
        whose amount `shares` decided, the weakest link of their derivation."""
        named = {c for cs in causes for c in cs}
        by = Evidence.OBSERVED_COMEMBERSHIP.value
        return {c: by if c in comembership else e for c, e in sorted(self.evidence.items()) if c in named} \
            or NO_EVIDENCE

    def shares(self, phase: str, players: Mapping[str, Iterable[str]]) -> dict[str, float]:
        """The fraction of the victim's observed wait in `phase` (TTFT: arrival to first token; ITL: after it) that
        each player (its requests: an n>1 client request's children) caused, as the causes price it: the step-cost
        model's marginal costs in the steps it shared or waited on, blocks held where it was preempted or queued for
        KV, over every co-member's. How what the re-simulation missed is split when no world of it shows a player
        to matter (attributor.py): a whale in none of those steps gets nothing (absent here), one decoding a token
        beside the victim far less than a chunk that filled the step, and the light crowd's fraction stays
        unexplained. Not `head_of_line` (the queue's head is in no step)."""
        overall = self._overall(phase)
        total = sum(secs for cause, secs in overall.items() if cause != _HEAD_OF_LINE and secs > 0)
        out: dict[str, float] = {}
        for player, requests in players.items() if total > 0 else ():
            by_cause: dict[str, float] = defaultdict(float)
            for rid in requests:
                for cause, secs in self.culprit(phase, rid).items():
                    if cause != _HEAD_OF_LINE and secs > 0:
                        by_cause[cause] += secs
            if (mine := sum(by_cause.values())) > 0:
                out[player] = min(1.0, mine / total)
        return out

    def _overall(self, phase: str) -> dict[str, float]:
        acc: dict[str, float] = defaultdict(float)
        for by_cause in self._eager[phase].values():
            for cause, secs in by_cause.items():
                acc[cause] += secs
        for cause, secs in self._lazy_overall[phase].items():
            acc[cause] += secs
        return acc


def observed_causes(lc: RequestLifecycle, view: EngineView) -> VictimCauses | None:
    """The victim's causes from the observed steps; None when no step covers its time in flight."""
    arrival, end = lc.arrival_ts, lc.end_ts
    if arrival is None or end is None:
        return None
    steps = view.between(arrival, end)
    if not steps:
        return None
    out = VictimCauses()
    preempted = _preempted_steps(lc, steps, view, out)
    rid = lc.request_id
    for step in steps:
        if step.iteration in preempted:
            continue
        mine = next((m for m in step.members if m.request_id == rid), None)
        phase = _phase(lc, step, mine)
        seconds = min(step.end_ts, end) - max(step.start_ts, arrival)
        # Not in a step before its first token: it waited (its span's scheduled time, arrival + vLLM's queue time,
        # runs early by the frontend's lag when the API server is slow to hand requests to the engine)
        queued = mine is None and (phase == "ttft" or lc.scheduled_ts is None
                                   or step.start_ts < lc.scheduled_ts - _STEP_EPS_S)
        if queued and arrival <= step.start_ts:
            _queued(out, phase, step, seconds, lc, view)
        else:
            _contention(out, phase, step, seconds, mine, rid, view)
    return out


def preempted_seconds(lc: RequestLifecycle, view: EngineView) -> float:
    """The seconds the victim lost to its observed preemptions (what a result reports when nobody is blamed for
    its time, so the other causes need not be worked out)."""
    arrival, end = lc.arrival_ts, lc.end_ts
    if arrival is None or end is None:
        return 0.0
    steps = view.between(arrival, end)
    if not steps:
        return 0.0
    out = VictimCauses()
    _preempted_steps(lc, steps, view, out)
    return out.preempted_s


def simulated_causes(traced: SimOutcome) -> VictimCauses:
    """The re-simulation's trace of the victim as causes (used when no engine step was observed)."""
    out = VictimCauses()
    first = traced.first_token_ts
    for w in traced.waits:
        phase = "ttft" if first is None or w.ts is None or w.ts < first else "itl"
        out.add(phase, Cause(w.cause), dict(w.by_request), w.seconds, Evidence.SIMULATED)
    return out


def _preempted_steps(lc: RequestLifecycle, steps: Sequence[StepRecord], view: EngineView,
                     out: VictimCauses) -> set[int]:
    """Add the stall and recompute of each preemption of the victim; returns the iterations they cover."""
    covered: set[int] = set()
    rid = lc.request_id
    for p in view.preemptions:
        if p.request_id != rid:
            continue
        k = next((i for i, s in enumerate(steps) if s.iteration == p.preempted_iteration), None)
        if k is None:
            continue
        held = max((m.context_tokens for s in steps[:k] for m in s.members if m.request_id == rid), default=0)
        holders = {r: b for r, b in view.holders(steps[k]).items() if r != rid}
        for s in steps[k:]:
            mine = next((m for m in s.members if m.request_id == rid), None)
            if mine is not None and mine.context_tokens - mine.tokens >= held:
                break  # it has rebuilt what it held: from here on it is an ordinary member
            phase = _phase(lc, s, mine)
            out.add(phase, Cause.PREEMPTION, holders, s.elapsed_s, Evidence.OBSERVED_PREEMPTION)
            out.preempted_s += s.elapsed_s
            covered.add(s.iteration)
            if mine is not None and mine.context_tokens >= held:
                break
    return covered


def _phase(lc: RequestLifecycle, step: StepRecord, mine: StepMember | None) -> str:
    """TTFT for the steps up to the one that computed the victim's first token: that step's log line can be
    stamped a few ms after the span's first token, so a step that began before it and ran the victim's prompt
    is the first token's own step."""
    first = lc.first_token_ts
    if first is None or step.end_ts <= first + _STEP_EPS_S:
        return "ttft"
    return "ttft" if mine is not None and mine.phase != "decode" and step.start_ts < first else "itl"


def _queued(out: VictimCauses, phase: str, step: StepRecord, seconds: float, lc: RequestLifecycle,
            view: EngineView) -> None:
    """A step the victim spent waiting to be scheduled: KV capacity, the queue's head, or the token budget."""
    holders, twice = view.kv(step)
    free = view.pool_blocks - 1 - sum(m.blocks for m in step.members) + twice  # vLLM keeps a null block
    head, held = view.head(step) or (lc, None)
    # vLLM admits a request only if its whole sequence fits: a preempted one its prompt and the output it had
    tokens = held + 1 if held is not None else (head.prompt_tokens or 1) + _generated(head, step)
    need = -(-tokens // view.block_size)
    if need > free and holders:
        out.add(phase, Cause.KV_PRESSURE, holders, seconds, Evidence.OBSERVED_STEPS)
        if head.request_id != lc.request_id:
            out.add(phase, Cause.HEAD_OF_LINE, {head.request_id: 1.0}, seconds, Evidence.OBSERVED_STEPS)
        return
    if step.context_tokens + step.generation_tokens >= view.token_budget:
        chunks = {m.request_id: float(m.tokens) for m in step.members if m.phase != "decode"}
        if chunks:
            out.add(phase, Cause.PREFILL_CONTENTION, chunks, seconds, Evidence.OBSERVED_STEPS)
            return
    _contention(out, phase, step, seconds, None, lc.request_id, view)


def _generated(lc: RequestLifecycle, step: StepRecord) -> int:
    """Output tokens a waiting request must bring back with it (a preempted one recomputes them)."""
    if lc.first_token_ts is None or lc.first_token_ts > step.start_ts or not lc.completion_tokens:
        return 0
    if lc.finish_ts is None or lc.finish_ts <= lc.first_token_ts:
        return 0
    done = (step.start_ts - lc.first_token_ts) / (lc.finish_ts - lc.first_token_ts)
    return int(min(max(done, 0.0), 1.0) * lc.completion_tokens)


def _contention(out: VictimCauses, phase: str, step: StepRecord, seconds: float, mine: StepMember | None,
                rid: str, view: EngineView) -> None:
    """The step's time beyond the victim's own, by the other members' marginal costs."""
    if not step.members:
        return
    shares = view.contention(step)
    index = shares.index
    if seconds <= 0 or not index or (len(index) == 1 and rid in index):
        return
    if mine is not None:  # the step's elapsed time less the victim's own share of its price, as vLLM's steps are
        # read (lab/cause_truth.py): an absolute price taken out of a 2 ms decode step priced 3.4 ms for the victim
        # alone left its co-members nothing, so ITL blame between decoders fell to `other` or to a rare chunk
        full = view.prices(step)[0].full
        seconds = min(seconds, step.elapsed_s)
        seconds -= seconds * min(view.pricer.solo(_member(mine)) / full, 1.0) if full > 0 else seconds
    (pf, bt, bw), (pf_pos, bt_pos, bw_pos) = shares.sums, shares.positive
    own = index.get(rid)
    if own is not None:  # the sums less the victim's own part (0 where it was the only one)
        decode, part, band = own
        n_pf, n_bt, n_bw = shares.counts
        if decode:
            bt, bw = bt - part, bw - band
            if part > 0:
                bt_pos = bt_pos - part if n_bt > 1 else 0.0
            if band > 0:
                bw_pos = bw_pos - band if n_bw > 1 else 0.0
        else:
            pf -= part
            if part > 0:
                pf_pos = pf_pos - part if n_pf > 1 else 0.0
    spent = pf + bt + bw
    if spent <= 0:
        return
    bw_evidence = Evidence.NVML_BANDWIDTH if view.prices(step)[1] is not None else Evidence.COST_MODEL
    out.contended(phase, shares, rid, (seconds * pf / spent, seconds * bt / spent, seconds * bw / spent),
                  (pf_pos, bt_pos, bw_pos), (Evidence.COST_MODEL, Evidence.COST_MODEL, bw_evidence))


def _member(m: StepMember) -> Member:
    return Member(m.request_id, m.tokens, max(m.context_tokens - m.tokens, 0), m.phase == "decode")


def _normalised(d: Mapping[str, float]) -> dict[str, float]:
    total = sum(v for v in d.values() if v > 0)
    return {k: v / total for k, v in d.items() if v > 0} if total > 0 else {}


def engine_view(timeline: EngineTimeline, config: SchedulerConfig, pricer: Pricer) -> EngineView:
    """The timeline's steps, requests, preemptions and GPU readings, with the pool the attributor simulates."""
    # the step list, their ends and the steps sharing prefix blocks are kept by the timeline as its window
    # changes: a pass copies two lists instead of walking the window's outcomes (35k steps at GPU rates)
    ends = timeline.step_ends()
    return EngineView(timeline.steps(), {lc.request_id: lc for lc in timeline.lifecycles()},
                      timeline.actionable_preemptions(), config.num_blocks, config.block_size, config.token_budget,
                      pricer, timeline.gpu, SharedBlocks(timeline.outcomes(), ends), _ends=list(ends))


class SharedBlocks(Mapping[_StepKey, tuple[Mapping[str, int], int]]):
    """`EngineView.kv_shared` of a timeline's steps, looked up when a victim reads a step (each outcome's split is
    worked out once, `StepOutcome.kv_split`): a pass reads its victims' steps, not every step of the window. A
    step is found by bisection on `ends` (the steps' end times, kept by the timeline), no index built: at GPU
    rates a third of the steps held share prefix blocks."""

    def __init__(self, outcomes: Sequence[tuple[StepInput, StepOutcome]], ends: Sequence[float] | None = None) -> None:
        self._outcomes = outcomes
        self._ends = ends if ends is not None else [o.record.end_ts for _, o in outcomes]

    def _find(self, key: _StepKey) -> StepOutcome | None:
        """The last step held with this (iteration, end) that shares blocks (as a dict built over them would)."""
        iteration, end = key
        found, ends, outcomes = None, self._ends, self._outcomes
        for i in range(bisect.bisect_left(ends, end), len(ends)):
            if ends[i] != end:
                break
            o = outcomes[i][1]
            if o.record.iteration == iteration and o.prefix_shares:
                found = o
        return found

    def get(self, key: _StepKey, default: Any = None) -> Any:  # Mapping's is by KeyError: most steps share nothing
        out = self._find(key)
        if out is None or not (split := out.kv_split()).twice:
            return default
        return dict(split.exclusive), split.twice

    def __getitem__(self, key: _StepKey) -> tuple[Mapping[str, int], int]:
        got: tuple[Mapping[str, int], int] | None = self.get(key)
        if got is None:
            raise KeyError(key)
        return got

    def __iter__(self) -> Iterator[_StepKey]:
        for _, o in self._outcomes:
            if o.prefix_shares and o.kv_split().twice:
                yield o.record.iteration, o.record.end_ts

    def __len__(self) -> int:
        return sum(1 for _ in self)
