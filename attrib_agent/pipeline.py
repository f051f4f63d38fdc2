"""The pure pipeline: typed events in, attribution results out; the same object live and in replay.

It never reads a clock: time is the receipt time of the events fed. Attribution runs when event time
passes the next settle tick, for the requests whose spans landed since, so feeding a recording event by
event (live) or all at once (replay) produces the same results at the same points. A victim whose
overlapping requests are still running gets a *partial* result (`final=False`), refined when they land
(or finalised after `partial_timeout_s`); only final results are tallied and handed to the sinks' `final`
stream, so no counter counts a victim twice.
"""

from __future__ import annotations

import zlib
from collections import Counter, OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, field, replace

from attrib_agent.attribution.attributor import AttributionConfig, Attributor
from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.attribution.fit_snapshot import EngineWatch
from attrib_agent.attribution.result import AttributionResult, Cause, itl_gaps
from attrib_agent.attribution.slo import SloConfig, SloTally
from attrib_agent.attribution.store import DEFAULT_MAX_BYTES, ResultStore
from attrib_agent.attribution.tally import SlowdownTally, phase_slowdowns, slowed
from attrib_agent.attribution.whales import KvUse, client_uses, footprints, whales
from attrib_agent.events import (
    EngineStep,
    Event,
    GpuSample,
    MetricsSnapshot,
    RequestAborted,
    RequestFailed,
    RequestSpan,
)
from attrib_agent.parallel_sampling import ClientRequests, client_status
from attrib_agent.timeline.engine_timeline import EngineTimeline
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.timeline.preemption import InferredPreemption
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome

CLOCK_STEP_BACK_S = 30.0
"""Event (receipt) time going back further than this is the clock stepping back, not sources' disorder."""
MAX_PASS_WAIT_S = 0.25
"""While shedding, attribution passes are at most this much event time apart whatever `pass_gap_s` says (the gap
the agent also spaces its forecast refresh by, a whole simulation each): what is due waits at most this long. The
share's choice is made at every settle tick and a pass runs only when a chosen victim (or a partial result) waits,
so the fixed cost (what a pass reads of the whole timeline, ~10-20 ms on a 36k-step GPU-rate window, and a
cost-model refit) is paid per pass with victims: at the share floor (~0.6 victims a second at GPU rates) fewer
passes than one a second. One settle interval (the default's): a victim's pass comes at its next tick. At 0.5 s
(before) a victim landing just after a pass waited for the tick past that half second: 0.5-0.75 s, and with its
pass and the events queued behind it the live tail sat at 1.0-1.1 s. More victims a second pay more fixed costs,
which the agent's share accounts for (`Shedder.affordable` prices a victim with the passes' fixed cost spread)."""


def chosen(request_id: str, share: float) -> bool:
    """Whether a finished request is attributed while a `share` of them is: by a hash of its id, so the choice is
    stable and unbiased, and nested (chosen at one share, chosen at every larger one)."""
    return share >= 1.0 or zlib.crc32(request_id.encode()) < share * 2**32


@dataclass(frozen=True)
class PipelineConfig:
    engine: int = 0
    block_size: int | None = None  # override vllm:cache_config_info
    num_blocks: int | None = None
    token_budget: int | None = None  # vLLM's max_num_batched_tokens (default: inferred from the steps)
    settle_interval_s: float = 0.25  # event time between attribution passes
    partial_timeout_s: float = 120.0  # a partial result is finalised this long after the victim finished
    settle_margin_s: float = 0.5  # event time past a victim's finish before it can be final (late log lines)
    final_horizon_s: float = 10.0  # a request in flight (no span) this long holds no other result any more
    max_results: int = 100_000
    max_result_age_s: float = 3600.0
    max_result_bytes: int = DEFAULT_MAX_BYTES  # what the stored results may take (packed, as the store counts it)
    max_pending: int = 10_000  # victims waiting for attribution or refinement
    victim_threshold_s: float = 0.1  # slowdown that makes a request a "slowed" victim in the counters
    attribution: AttributionConfig = field(default_factory=AttributionConfig)
    slo: SloConfig = field(default_factory=SloConfig)  # budgets and shape classes of the goodput series

    def __post_init__(self) -> None:
        if self.settle_interval_s <= 0 or self.partial_timeout_s <= 0 or self.max_pending < 1:
            raise ValueError("settle_interval_s and partial_timeout_s must be > 0, max_pending >= 1")
        if self.settle_margin_s < 0 or self.final_horizon_s <= 0:
            raise ValueError("settle_margin_s must be >= 0 and final_horizon_s > 0")


@dataclass(frozen=True, slots=True)
class KvNow:
    """The KV picture at the latest step: who holds how much of the pool."""

    ts: float | None
    pool_blocks: int | None
    ledger_blocks: int
    vllm_blocks: float | None  # vLLM's own gauge x pool at the last metrics sample
    residual_blocks: float | None  # vLLM minus ledger at the last metrics sample
    held: dict[str, int]  # request id -> blocks held at the latest step
    whales: tuple[str, ...]  # requests in flight whose footprint makes them whales
    top_request_id: str | None
    top_share: float  # of the pool, 0..1


@dataclass(frozen=True, slots=True)
class PipelineStats:
    """What went through the pipeline and what its bounded stores hold now (the `attrib_*` pipeline series)."""

    events: dict[str, int]  # by event type name
    steps_total: int
    step_seconds_total: float
    vllm_restarts: int
    preemptions_inferred: int
    dropped_pending: int
    results_stored: int
    results_evicted: int
    results_bytes: int  # what the stored results count against `max_result_bytes`
    timeline_held: dict[str, int]  # by kind
    last_event_ts: float | None


class AttributionPipeline:
    """Feed events; collect results from `feed`'s return (or `settle`). Read state for the sinks."""

    def __init__(self, config: PipelineConfig | None = None) -> None:
        self.config = cfg = config or PipelineConfig()
        self.timeline = self._new_timeline()
        self.attributor = Attributor(cfg.attribution)
        self.engine_watch = EngineWatch(cfg.engine, lambda: self.timeline.geometry, cfg.token_budget)  # a saved fit's
        self.store = ResultStore(cfg.max_results, cfg.max_result_age_s, cfg.max_result_bytes)
        self.tally = SlowdownTally(victim_threshold_s=cfg.victim_threshold_s, slo=SloTally(cfg.slo))
        self.events: Counter[str] = Counter()
        self.vllm_restarts = 0
        self._restarted_ts: float | None = None  # when the last restart was seen: no span of before it will land
        self._old_server_until: float | None = None  # the old server's last scrape before that restart
        self._last_scrape_ts: float | None = None
        self.steps_total = 0
        self.step_seconds_total = 0.0
        self._dropped = 0  # victims dropped waiting (past max_pending): `dropped_pending`
        self.preemptions_inferred = 0  # of requests whose results became final (each counted once)
        self.last_event_ts: float | None = None
        self.clock_steps_back = 0  # times event time went back more than CLOCK_STEP_BACK_S (a stepped clock)
        self._spans: OrderedDict[str, tuple[str, str]] = OrderedDict()  # request id -> (trace id, span id)
        self._due: OrderedDict[str, None] = OrderedDict()  # spans landed, not yet attributed
        self._partial: OrderedDict[str, float] = OrderedDict()  # victim -> its finish time
        self._next_settle: float | None = None
        self.version = 0  # bumped by every feed and settle: readers cache what they render per version
        self.settles = 0  # settle passes run: readers keep what changes slowly (the forecast's state) per settle
        self._kv_now: tuple[int, KvNow] | None = None
        # Load shedding (set by the live agent under overload, agent/shedding.py; 1.0 in replay): the share of
        # newly landed requests attributed, chosen by a hash of the id so the choice is stable and unbiased.
        self.attribute_share = 1.0
        self.pass_gap_s = 0.0  # ... in passes at least this much event time apart (a pass has a fixed cost)
        # Live, the agent's freshness budget over a pass's measured cost: a pass takes at most this many new
        # victims (those chosen at `floor_share` first, then the oldest); the rest wait for the next pass, or are
        # shed there if the share fell meanwhile. None: no bound (a replay).
        self.max_pass_victims: int | None = None
        self.floor_share = 0.0  # victims chosen at this share (the agent's floor) are never held back by that bound
        self._last_pass: float | None = None
        self.victims_skipped = 0
        self._skipped: OrderedDict[str, None] = OrderedDict()  # the last max_pending skipped ids, for status()
        # Requests that ended without a result (aborted or failed in the log, skipped), as (id, status), until the
        # journal takes them (`take_ended`), and what an earlier agent's journal said of such requests
        # (`restore_ended`): a restarted agent answers them `aborted` or `skipped`, not unknown. The last
        # max_pending of each.
        self._ended: deque[tuple[str, str]] = deque(maxlen=cfg.max_pending)
        self._restored_ended: OrderedDict[str, str] = OrderedDict()
        # While shedding, a request the share leaves out is attributed all the same when it finished visibly
        # slowed (`visible_slowdown`): the ones an operator asks about. At most `rescue_per_s` a second of event time
        # (the agent's: what its CPU budget affords; None: no such bound, the pass bound still holds), the rest
        # counted skipped (`slowed_skipped`, also in `victims_skipped`).
        self.rescue_per_s: float | None = None
        self._rescue_tokens = 0.0
        self._rescue_ts: float | None = None
        self._rescued: OrderedDict[str, None] = OrderedDict()  # taken so, waiting or partial (bounded: max_pending)
        self.slowed_rescued = 0  # taken so into a pass, since start (the shedder prices them)
        self.slowed_attributed = 0  # ... whose result is final
        # ... their slowdown blamed on culprits, by cause (every Cause value, an unknown one as `other`: bounded)
        self.slowed_blamed_s: dict[str, float] = dict.fromkeys((c.value for c in Cause), 0.0)
        self.slowed_skipped = 0  # visibly slowed outside the share, skipped past those bounds
        self._slowed_basis: tuple[int, tuple[float, float]] | None = None  # (budget, frontend offsets) this settle
        self._pass_budget: int | None = None  # the step budget of the last pass (read without a step inference)
        # n>1 requests (parallel sampling): the timeline keeps each child apart (vLLM runs each as its own engine
        # request), the agent reports one result per client request, its children's together
        self.clients = ClientRequests(cfg.max_results, cfg.max_pending)

    # ---- input -------------------------------------------------------------------------------------------
    def feed(self, event: Event) -> list[AttributionResult]:
        """Take one event; returns the results (partial and final) of a settle pass if this event began one."""
        self.version += 1
        self.events[type(event).__name__] += 1
        ts = event.ts
        stepped: list[AttributionResult] = []
        if self.last_event_ts is not None and ts < self.last_event_ts - CLOCK_STEP_BACK_S:
            stepped = self._clock_stepped_back(ts)
        self.last_event_ts = ts if self.last_event_ts is None else max(self.last_event_ts, ts)
        if isinstance(event, MetricsSnapshot) and event.counter_reset and event.engine == str(self.config.engine):
            self.vllm_restarts += 1
            self._restarted_ts = ts
            self._old_server_until = self._last_scrape_ts
        if isinstance(event, MetricsSnapshot) and event.engine == str(self.config.engine):
            self._last_scrape_ts = ts
        if isinstance(event, EngineStep) and event.engine == self.config.engine and not event.dummy:
            self.steps_total += 1
            self.step_seconds_total += event.elapsed_ms / 1000.0
        self.timeline.feed(event)
        if isinstance(event, RequestAborted | RequestFailed):
            self._ended.append((event.request_id, "aborted"))
        self.engine_watch.see(event, self.attributor.cost)
        if isinstance(event, RequestSpan) and (owner := self.timeline.span_owner(event)) is not None:
            # an n>1 request's spans all name the parent: each is its child's (the timeline's lifecycle)
            self._remember_span(event if owner == event.request_id else replace(event, request_id=owner))
        elif self.timeline.moved_spans:  # a parent's span came before the log named its children: the child's now
            self._span_moved()
        if self._next_settle is None:
            self._next_settle = ts + self.config.settle_interval_s
        if ts < self._next_settle:
            return stepped
        return stepped + self.settle()

    def _new_timeline(self) -> EngineTimeline:
        cfg = self.config
        return EngineTimeline(cfg.block_size, cfg.num_blocks, engine=cfg.engine, token_budget=cfg.token_budget)

    def _clock_stepped_back(self, ts: float) -> list[AttributionResult]:
        """The host's clock stepped back (NTP, a restored VM), and vLLM's times with it: attribute what is due on
        the timeline so far, finalise the partial results as they are (they cannot be refined across the step),
        then start a fresh timeline and time base. Otherwise the steps after the step would pile onto the last
        one before it, the requests after it be forgotten unattributed, and settling wait for the clock to catch
        up. Stored results stay: their age counts from the new time on, so none is dropped for being "new"."""
        self._last_pass = None  # this pass runs, shedding or not: the timeline it needs goes next
        out = self.settle()
        for rid in list(self._partial):
            r = self.result(rid)  # an n>1 child: its client request's result
            if r is not None and not r.final:
                r = replace(r, final=True)
                self._keep(r)
                self._spans.pop(rid, None)
                self._rescued.pop(rid, None)
                self.clients.forget(r.request_id)
                out.append(r)
        self._partial.clear()
        self.clock_steps_back += 1
        self.timeline = self._new_timeline()
        self.last_event_ts = ts
        self._last_pass = None  # its time is the old time base's: the new one's passes would wait an hour for it
        self._next_settle = ts + self.config.settle_interval_s
        return out

    def feed_all(self, events: list[Event] | tuple[Event, ...]) -> list[AttributionResult]:
        out: list[AttributionResult] = []
        for ev in events:
            out.extend(self.feed(ev))
        return out

    def _span_moved(self) -> None:
        """The spans the timeline gave to an n>1 child after the log named the parent's children: what was filed
        under the parent (due, waiting, a partial result of a lifecycle that is gone) is the child's."""
        for span, child in self.timeline.moved_spans:
            parent = span.request_id
            self._due.pop(parent, None)
            self._spans.pop(parent, None)
            self._partial.pop(parent, None)
            self._remember_span(replace(span, request_id=child))
        self.timeline.moved_spans.clear()

    def _remember_span(self, span: RequestSpan) -> None:
        done = self.store.get(span.request_id)
        if done is not None and done.final and (done.trace_id, done.span_id) == (span.trace_id, span.span_id):
            return  # the same span again (an exporter retrying an export): attributed and counted already
        self._spans[span.request_id] = (span.trace_id, span.span_id)
        self._spans.move_to_end(span.request_id)
        # Only spans still waiting for a final result are kept here (popped when it is stored: it carries its
        # span's ids), or skipped (popped then) or evicted past max_pending.
        while len(self._spans) > self.config.max_pending:
            self._spans.popitem(last=False)
        self._due[span.request_id] = None
        self._due.move_to_end(span.request_id)
        while len(self._due) + len(self._partial) > self.config.max_pending and self._due:
            self._due.popitem(last=False)
            self._dropped += 1

    @property
    def dropped_pending(self) -> int:
        """Victims dropped waiting for attribution or refinement, and n>1 client requests waiting for a child."""
        return self._dropped + self.clients.dropped

    def _keep(self, r: AttributionResult) -> None:
        """Store a result the pipeline reports, and tally it when final (it is final once)."""
        self.store.put(r)
        if r.final and r.chosen_by == "slowed":  # outside the hash sample: counted, not tallied (the sample's rates,
            self.slowed_attributed += 1  # the victims' share of requests and the SLO misses, would be biased)
            blamed = self.slowed_blamed_s
            for c in r.culprits:
                for cause, secs in c.blame_by_cause(r.itl_gaps).items():
                    key = cause if cause in blamed else Cause.OTHER.value
                    blamed[key] += secs
        elif r.final:
            self.tally.add(r)

    # ---- attribution -------------------------------------------------------------------------------------
    def settle(self) -> list[AttributionResult]:
        """Attribute what is due: new spans, and partial results whose blockers have landed or timed out."""
        now = self.last_event_ts
        if now is None:
            return []
        self.version += 1
        self.settles += 1
        self._next_settle = now + self.config.settle_interval_s
        gap = min(self.pass_gap_s, MAX_PASS_WAIT_S)
        self._slowed_basis = None
        wanted = {rid for rid in self._due if self._attributed(rid)}
        if len(wanted) < len(self._due):  # shed: cheap to tell, so told at once (no pass needed)
            left = [rid for rid in self._due if rid not in wanted]
            wanted |= self._rescue(left, now)
            self._skip(rid for rid in left if rid not in wanted)
            self._due = OrderedDict.fromkeys(rid for rid in self._due if rid in wanted)
        if not wanted and not self._partial:
            # nothing to attribute: no pass (the timeline is not brought up to date for nothing), and while
            # shedding no pass time either, so the next victim's pass need not wait for this one
            return []
        if gap > 0 and self._last_pass is not None and now - self._last_pass < gap:
            return []  # shedding: what is due waits (bounded by max_pending and MAX_PASS_WAIT_S) for the next pass
        self._last_pass = now
        self.attributor.one_refit_a_pass = self.pass_gap_s > 0  # shedding: one cost-model refit a pass
        lcs = {lc.request_id: lc for lc in self.timeline.lifecycles()}
        modes: dict[str, str] = {}  # each victim's mode, decided once a pass: its blockers and its result read it
        ready = {rid for rid, finished in self._partial.items()
                 if now - finished >= self.config.partial_timeout_s or not self._blockers(rid, lcs, now, modes)}
        held = self._beyond_cap(wanted, len(ready))
        wanted = (wanted - held) | ready
        if over := [rid for rid in self._due if rid in held and rid in self._rescued]:  # no waiting past its pass:
            self._skip(over)  # bounded by the pass as by the second
            self.slowed_skipped += len(over)
            held.difference_update(over)
        self.slowed_rescued += sum(rid in self._rescued and rid not in self._partial for rid in wanted)
        if held:
            self._due = OrderedDict.fromkeys(rid for rid in self._due if rid in held)
        else:
            self._due.clear()
        if not wanted:
            return []
        out: list[AttributionResult] = []
        attributed: set[str] = set()
        finalised: set[str] = set()
        filed: dict[str, AttributionResult] = {}  # n>1 client requests this pass filed a child of
        results = self.attributor.attribute(self.timeline, wanted)
        if self.attribute_share < 1.0:  # the pass's budget, for `visible_slowdown` (kept per timeline version: read
            self._pass_budget = self.timeline.token_budget()  # as the pass left it, no step inference more)
        for r in results:
            lc = lcs.get(r.request_id)
            ids = self.span_of(r.request_id)
            timed_out = now - r.finished_ts >= self.config.partial_timeout_s
            final = timed_out or lc is None or not self._blockers(r.request_id, lcs, now, modes)
            mode = self._mode(r.request_id, lc, r.finished_ts, modes)
            r = replace(r, final=final, trace_id=ids[0] if ids else None, span_id=ids[1] if ids else None, mode=mode)
            if r.request_id in self._rescued:
                r = replace(r, chosen_by="slowed")
            cid = self.timeline.client_of(r.request_id)
            if cid == r.request_id:
                self._keep(r)
                out.append(r)
            else:  # an n>1 child: its client request's one result, its children's parts so far
                self._keep(combined := self.clients.file(self.timeline, cid, r))
                filed[cid] = combined
            if final:
                self._partial.pop(r.request_id, None)
                self._spans.pop(r.request_id, None)  # the stored result carries its span's ids (`span_of`)
                self._rescued.pop(r.request_id, None)
                finalised.add(r.request_id)
            else:
                self._partial[r.request_id] = r.finished_ts
            attributed.add(r.request_id)
        out.extend(filed.values())
        for r in self.clients.close(self.timeline, filed):
            self._keep(r)
            out.append(r)
        for rid in wanted - attributed:  # forgotten by the timeline before it could be attributed
            self._partial.pop(rid, None)
            self._spans.pop(rid, None)
            self._rescued.pop(rid, None)
        while len(self._partial) > self.config.max_pending:
            self._partial.popitem(last=False)
            self._dropped += 1
        self._count_preemptions(finalised)
        self.store.expire(now)
        return out

    def client_id(self, request_id: str) -> str:
        """The request the agent reports `request_id` under: an n>1 child's client request, else itself."""
        return self.clients.client_id(self.timeline, request_id)

    def _attributed(self, rid: str) -> bool:
        # an n>1 request's children are chosen together (by their client request's id)
        return rid in self._rescued or chosen(self.timeline.client_of(rid), self.attribute_share)

    def visible_slowdown(self, rid: str) -> float:
        """How far a request whose span landed finished slowed past `victim_threshold_s` (the tally's rule), in
        seconds of its own time in its most slowed phase, over what the step-cost model says it would take alone;
        0 when it was not: from its own times, the cost model and the frontend offsets learnt so far (no
        re-simulation). Its result may differ a little: the pass refits."""
        lc = self.timeline.logged(rid)
        if lc is None or not lc.complete:
            return 0.0
        if self._slowed_basis is None:  # once a settle
            budget = self._pass_budget if self._pass_budget is not None else self.timeline.token_budget()
            self._slowed_basis = (budget, self.attributor.frontend_offsets())
        ttft, itl = self.attributor.slowdowns(lc, self.timeline.cached_tokens(rid), *self._slowed_basis)
        return max((s for _, s in phase_slowdowns(ttft, itl, itl_gaps(lc.completion_tokens))
                    if slowed(s, self.config.victim_threshold_s)), default=0.0)

    def _rescue(self, left: list[str], now: float) -> set[str]:
        """Of the requests the share `left` out (in the order they landed), those that finished visibly slowed,
        the most slowed first (the tail an operator asks about; ties the oldest first), as many as `rescue_per_s`
        allows: attributed whatever the share (`chosen_by` "slowed"). An n>1 request's children are not (its one
        result needs all of them). The other slowed are skipped."""
        by = {rid: s for rid in left if self.timeline.client_of(rid) == rid and (s := self.visible_slowdown(rid)) > 0}
        if not by:
            return set()
        slow = sorted(by, key=lambda rid: -by[rid])  # stable: in landing order among equals
        took = slow[:self._rescue_room(now, len(slow))]
        self.slowed_skipped += len(slow) - len(took)
        self._rescued.update(dict.fromkeys(took))
        while len(self._rescued) > self.config.max_pending:
            self._rescued.popitem(last=False)
        return set(took)

    def _rescue_room(self, now: float, want: int) -> int:
        """How many slowed requests may be taken outside the share now: a bucket of one second's worth of
        `rescue_per_s` (at least one), filled in event time; all of them without a rate."""
        rate = self.rescue_per_s
        if rate is None:
            return want
        size = max(1.0, rate)
        last, self._rescue_ts = self._rescue_ts, now
        filled = size if last is None else rate * max(0.0, now - last)
        self._rescue_tokens = min(size, self._rescue_tokens + filled)
        n = min(want, int(self._rescue_tokens))
        self._rescue_tokens -= n
        return n

    def _beyond_cap(self, wanted: set[str], refining: int) -> set[str]:
        """The new victims this pass leaves for the next under `max_pass_victims`, counting the `refining` partial
        results it takes again (never held: they are older): those chosen at `floor_share` go first, whatever the
        bound, then those taken outside the share as visibly slowed, then the rest, each in the order they landed
        (the oldest first: none waits behind newer ones pass after pass). Empty without a bound. (The caller skips
        the slowed taken outside the share that are left over: they do not wait. One chosen by the share that waits
        is taken outside it if the share falls and it was slowed.)"""
        cap = self.max_pass_victims
        if cap is None or len(wanted) + refining <= cap:
            return set()
        order = [rid for rid in self._due if rid in wanted]
        floor = [rid for rid in order if chosen(rid, self.floor_share)]
        room = max(0, cap - refining - len(floor))
        rest = [rid for rid in order if not chosen(rid, self.floor_share)]
        rest.sort(key=lambda rid: rid not in self._rescued)  # stable: the oldest first in each
        return set(rest[room:])

    def settles_on(self, ts: float) -> bool:
        """Whether feeding an event received at `ts` begins a settle (the agent times its passes by it)."""
        return self._next_settle is not None and ts >= self._next_settle

    def _skip(self, rids: Iterable[str]) -> None:
        for rid in rids:
            self.victims_skipped += 1
            self._skipped[rid] = None
            self._ended.append((rid, "skipped"))
            self._spans.pop(rid, None)
        while len(self._skipped) > self.config.max_pending:
            self._skipped.popitem(last=False)

    def _count_preemptions(self, finalised: set[str]) -> None:
        """Count a request's inferred preemptions once, when its result is final: the timeline's own list
        covers only the steps it still holds, so it cannot back a monotonic counter."""
        if finalised:
            self.preemptions_inferred += sum(p.request_id in finalised for p in self.timeline.actionable_preemptions())

    def _mode(self, rid: str, lc: RequestLifecycle | None, finished_ts: float, modes: dict[str, str]) -> str:
        """Which mode answers for `rid` (`EngineTimeline.mode` from its arrival to `finished_ts`), decided once a
        settle pass in `modes`: its blockers and its result both read it (each a scan of the steps since)."""
        mode = modes.get(rid)
        if mode is None:
            mode = modes[rid] = self.timeline.mode(lc.arrival_ts if lc is not None else None, finished_ts)
        return mode

    def _blockers(self, rid: str, lcs: dict[str, RequestLifecycle], now: float, modes: dict[str, str]) -> list[str]:
        """What `rid`'s answer still waits for; empty when its result can be final (`modes`: `_mode`'s, this pass).

        A victim's re-simulation reads, of each request that overlapped it in the engine, its arrival, its
        prompt and, only where that request ended before the victim did, its end. So it waits for:
        - itself: event time `settle_margin_s` past its finish (a line logged just before it lands late), or, on a
          log with vLLM's own sub-second stamps, a step line stamped at or past its finish read (the log is read
          in order, and vLLM logs the step that finished it after ending its span: nothing before is still due);
        - each overlapping request without a span that ended (as the steps show) before the victim finished:
          its span is on its way and brings its exact times and token counts;
        - each overlapping request whose prompt is not known yet (still queued or prefilling at the victim's
          finish): the steps will tell when its prefill completes.
        A request still running past the victim's finish with its prompt known holds nothing (what is left of
        it, its output length, cannot change the victim's past), nor does one in flight for `final_horizon_s`
        (its span lost, or stuck), one that ended before the victim arrived, or one that ended with a vLLM
        restart. Continuous load never closes a busy period, and needs none of this to wait for it."""
        me = lcs.get(rid)
        if me is None or me.arrival_ts is None:
            return []
        end = me.end_ts if me.end_ts is not None else float("inf")
        covered = self.timeline.last_step_end()
        ran_past = covered is not None and covered >= end
        if now < end + self.config.settle_margin_s and not (ran_past and self.timeline.log_stamped):
            return [rid]
        if (self.timeline.exact_reported and now < end + self.config.final_horizon_s
                and self._mode(rid, me, end, modes) != "exact"):
            return [rid]  # exact mode: the plugin's facts of its steps come on their own socket, maybe after the log
        gone = self._restarted_ts if self._restarted_ts is not None else float("-inf")
        return [lc.request_id for lc in lcs.values()
                if lc.request_id != rid and not lc.complete and lc.aborted_ts is None
                and lc.arrival_ts is not None and lc.arrival_ts < end
                and now - lc.arrival_ts < self.config.final_horizon_s
                and not (lc.end_ts is not None and lc.end_ts < me.arrival_ts)
                and not (ran_past and lc.prompt_tokens is not None and (lc.finish_ts is None or lc.finish_ts > end))
                and not (lc.end_ts is not None and lc.end_ts <= gone) and not self._lost(lc)]

    def _lost(self, lc: RequestLifecycle) -> bool:
        """Taken in by the server that restarted since (before its last scrape) and never finished: its span
        died with it. (The timeline also ends such a request at the restart when its steps show it held.)"""
        until = self._old_server_until
        return until is not None and not lc.complete and lc.arrival_ts is not None and lc.arrival_ts <= until

    # ---- reads for the sinks -----------------------------------------------------------------------------
    def stats(self) -> PipelineStats:
        return PipelineStats(dict(self.events), self.steps_total, self.step_seconds_total, self.vllm_restarts,
                             self.preemptions_inferred, self.dropped_pending, len(self.store), self.store.evicted,
                             self.store.bytes, dict(self.timeline.sizes()), self.last_event_ts)

    def result(self, request_id: str) -> AttributionResult | None:
        """The stored result; for an n>1 child's id, its client request's (the one result reported)."""
        r = self.store.get(request_id)
        if r is None and (client_id := self.clients.filed_under(request_id)) is not None:
            r = self.store.get(client_id)
        return r

    def lifecycle(self, request_id: str) -> RequestLifecycle | None:
        """The request's lifecycle; for an n>1 client request (no lifecycle of its own: vLLM runs its children),
        the one its children make together, while the timeline holds them."""
        lc = self.timeline.lifecycle(request_id)
        return lc if lc is not None else self.clients.lifecycle(self.timeline, request_id)

    def lifecycles(self) -> list[RequestLifecycle]:
        return self.timeline.lifecycles()

    def preemptions(self) -> list[InferredPreemption]:
        return self.timeline.preemptions()

    def actionable_preemptions(self) -> list[InferredPreemption]:
        return self.timeline.actionable_preemptions()

    def outcomes(self) -> list[tuple[StepInput, StepOutcome]]:
        """The engine steps held, each with what the timeline reconstructed of it."""
        return self.timeline.outcomes()

    def pool(self) -> tuple[int | None, int | None]:
        """(block size, pool blocks) as far as known."""
        return self.timeline.pool()

    def token_budget(self) -> int:
        """The step budget the re-simulation and the forecast run with (`EngineTimeline.token_budget`)."""
        return self.timeline.token_budget()

    def token_budget_source(self) -> str:
        """configured, announced, inferred or guessed (`EngineTimeline.token_budget_source`)."""
        return self.timeline.token_budget_source()

    def gpu_samples(self, since: float | None = None) -> list[GpuSample]:
        """The GPU's own readings (NVML) the timeline holds, oldest first."""
        return self.timeline.gpu.samples(since)

    @property
    def victim_threshold_s(self) -> float:
        return self.config.victim_threshold_s

    @property
    def cost_model(self) -> StepCostModel:
        """The step-cost model the attributor fits (its `fitted` gates readiness)."""
        return self.attributor.cost

    def mode(self) -> str:
        """Which mode answers now: `exact` while the step plugin reports the latest step held, else `inferred`."""
        last = self.timeline.last_step_end()
        return "inferred" if last is None else self.timeline.mode(last, None)

    def status(self, request_id: str) -> str:
        """`final`, `partial` (culprits still running), `running` (known, not finished), `aborted` (ended without
        finishing: aborted, failed, or lost when vLLM restarted; no result will come), `skipped` (finished while
        the agent shed load: not attributed), or `unknown`."""
        settled = self.settled_status(request_id)
        if settled is not None:
            return settled
        lc = self.timeline.logged(request_id)  # the inferred times are not needed: no step inference forced
        if lc is None:  # an n>1 client request (else unknown): as its children are
            return client_status([self.status(k) for k in self.timeline.children(request_id)])
        if lc.complete:
            return "running"
        lost = lc.aborted_ts is not None or self._lost(lc) or self.timeline.lost_in_restart(request_id)
        return "aborted" if lost else "running"

    def settled_status(self, request_id: str) -> str | None:
        """`status()` where the settle passes' own maps answer it (stored, waiting, skipped), without reading the
        timeline: cheap, and safe to ask from another thread than the one feeding (a dict lookup each)."""
        r = self.result(request_id)  # for an n>1 child's id, its client request's
        if r is not None:
            return "final" if r.final else "partial"
        if request_id in self._due:
            return "running"
        return "skipped" if request_id in self._skipped else self._restored_ended.get(request_id)

    def take_ended(self) -> list[tuple[str, str]]:
        """(id, `aborted` or `skipped`) of the requests that ended without a result since the last call (the
        journal's, so that a restarted agent still answers them)."""
        out = list(self._ended)
        self._ended.clear()
        return out

    def restore_ended(self, request_id: str, status: str) -> None:
        """An earlier agent's word that `request_id` ended without a result (`aborted` or `skipped`)."""
        self._restored_ended[request_id] = status
        self._restored_ended.move_to_end(request_id)
        while len(self._restored_ended) > self.config.max_pending:
            self._restored_ended.popitem(last=False)

    def kv_now(self) -> KvNow:
        """The KV picture at the latest step, kept per state version: it reads the ledger's last reconciliation
        (a few steps from the end, `EngineTimeline.kv_latest`), not the whole ledger rebuilt per scrape."""
        if self._kv_now is None or self._kv_now[0] != self.version:
            self._kv_now = (self.version, self._kv_at_latest())
        return self._kv_now[1]

    def _kv_at_latest(self) -> KvNow:
        latest = self.timeline.kv_latest()
        block_size, pool = self.timeline.pool()
        last_ts = latest.step.ts if latest.step is not None else None
        held = {k: v for k, v in latest.held.items() if v > 0}
        clients = self.timeline.clients()  # the whale rule judges an n>1 request as its client request
        weights = {rid: f for rid, f in footprints(client_uses(self._kv_uses(), clients)).items() if f > 0}
        pool_tokens = block_size * pool if block_size and pool else None
        in_flight = set(whales(weights, self.config.attribution.whale_factor, pool_tokens)) & (
            {clients.get(rid, rid) for rid in held} if clients else held.keys())
        whale_ids = tuple(sorted(in_flight))
        top = max(held.items(), key=lambda kv: (kv[1], kv[0]), default=None)
        last_rec = latest.sample
        return KvNow(ts=last_ts, pool_blocks=pool, ledger_blocks=sum(held.values()),
                     vllm_blocks=last_rec.observed_blocks if last_rec else None,
                     residual_blocks=last_rec.residual if last_rec else None, held=held, whales=whale_ids,
                     top_request_id=top[0] if top else None,
                     top_share=(top[1] / pool) if top and pool else 0.0)

    def _kv_uses(self) -> list[KvUse]:
        """The held requests' token counts in arrival order (unknown arrivals last), for the whale rule."""
        lcs = sorted(self.timeline.lifecycles(), key=lambda lc: (lc.arrival_ts is None, lc.arrival_ts or 0.0))
        tl = self.timeline
        return [_kv_use(lc, tl.cached_tokens(lc.request_id),
                        tl.prefilled_tokens(lc.request_id) if lc.prompt_tokens is None else 0) for lc in lcs]

    def span_of(self, request_id: str) -> tuple[str, str] | None:
        """(trace id, span id) of the request's `llm_request` span, if it landed: from its stored result, or
        for one not attributed yet from the last `max_pending` spans."""
        ids = self._spans.get(request_id)
        if ids is None:
            r = self.store.get(request_id)
            if r is not None and r.trace_id is not None and r.span_id is not None:
                ids = (r.trace_id, r.span_id)
        return ids


def _kv_use(lc: RequestLifecycle, cached: int, prefilled: int = 0) -> KvUse:
    """`prefilled`: what vLLM computed so far of a prompt the steps have not seen end (its prefix hits are `cached`),
    so a whale still prefilling weighs what it already holds (nu17: 32 of 88 blocks called no whale)."""
    out = lc.completion_tokens if lc.completion_tokens is not None else (lc.max_tokens or 0)
    prompt = lc.prompt_tokens if lc.prompt_tokens is not None else cached + prefilled
    return KvUse(lc.request_id, prompt, out, cached)
