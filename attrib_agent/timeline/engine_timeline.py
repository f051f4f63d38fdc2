"""One engine's timeline: lifecycles, steps with their members, the KV ledger and inferred preemptions.

Fed events one at a time (live) or all at once (replay), it gives the same answers: whatever is asked in
between, every step held ends up inferred from all the facts known about the requests it can involve (see
reinference.py). Memory is bounded: steps older than every open request (and than `keep_s`) leave in
chunks, with the requests that ended before them; hard caps bound steps, requests and samples.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import OrderedDict, deque
from collections.abc import Iterable
from dataclasses import dataclass, replace

from attrib_agent.events import (
    EngineStep,
    Event,
    GpuSample,
    MetricsSnapshot,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestReceived,
    RequestSpan,
    SchedulerHello,
    SchedulerStep,
    TokenBudgetLine,
)
from attrib_agent.timeline.exact import ExactSteps, certain, exact_iterations
from attrib_agent.timeline.gpu_samples import GpuSamples
from attrib_agent.timeline.ledger import KvBlockLedger, KvLatest, MetricsSample, block_seconds, kv_latest
from attrib_agent.timeline.lifecycle import LifecycleBook
from attrib_agent.timeline.model import RequestLifecycle, StepRecord
from attrib_agent.timeline.preemption import InferredPreemption, PreemptionCounts, infer_preemptions, preemption_counts
from attrib_agent.timeline.reinference import TimelineInference
from attrib_agent.timeline.sched_state import Geometry, StepInput
from attrib_agent.timeline.step_outcome import StepOutcome
from attrib_agent.timeline.timeline_window import StepWindow
from attrib_agent.vllm_ids import CHILD_PREFIX

DEFAULT_TOKEN_BUDGET = 2048  # vLLM's max_num_batched_tokens on CPU; GPUs often run 8192
BUDGET_SOURCES = ("configured", "announced", "saved", "inferred", "guessed")  # token_budget_source's answers
MAX_EARLY_SPANS = 256
"""Spans that admitted their request before any log line (kept in case `Added` lines then name it an n>1 parent):
the last this many. Live, such a span is at most a log poll (0.1 s) ahead of the lines."""
BOUND_EVERY_FEEDS = 1024  # how often the time-based bounds are applied (the hard caps are checked every feed)


@dataclass(frozen=True, slots=True)
class MembershipQuality:
    """How well the inferred members explain the logged counts."""

    steps: int
    exact_share: float  # share of steps whose members reproduce all four counts; 0.0 with no steps (no evidence)
    mean_error: float  # mean of |inferred - logged| summed over the four counts
    max_error: int


class EngineTimeline:
    """The timeline of one vLLM engine (`engine` is the data-parallel index in its logs and metrics).

    block_size/num_blocks/token_budget override what the metrics and the steps show. Bounds: at most
    `max_steps` steps, `max_requests` lifecycles and `max_samples` metrics samples; steps older than every
    open request and than `keep_s` are dropped, and an inferred finish whose span has not come within
    `open_timeout_s` stops holding the window open.
    """

    def __init__(self, block_size: int | None = None, num_blocks: int | None = None, *, engine: int = 0,
                 token_budget: int | None = None, max_steps: int = 50_000, max_requests: int = 10_000,
                 max_samples: int = 4_096, checkpoint_every: int = 32, keep_s: float = 30.0,
                 open_timeout_s: float = 300.0) -> None:
        self.engine = engine
        self._fixed = Geometry(block_size, num_blocks)
        self._configured_budget = token_budget
        self._announced_budget: int | None = None  # vLLM's own start-up line (TokenBudgetLine), when read
        self._budget_saved = False  # that budget came from a state file (restore_budget), not from a line read
        self._announced_at = 0  # the seq of the first step after that budget came: a vLLM restarted later drops it
        self._last_iteration: int | None = None  # of this engine's last step (an iteration going back: a restart)
        self._book = LifecycleBook(max_requests, engine)
        self._window = StepWindow(max_steps, checkpoint_every)
        self._inference = TimelineInference(self._book, self._window, self._fixed, token_budget or 0)
        self._samples: deque[MetricsSample] = deque(maxlen=max_samples)
        self.gpu = GpuSamples(max_samples)  # NVML readings: the bandwidth evidence of decode slowdowns
        self._keep_s = keep_s
        self._open_timeout_s = open_timeout_s
        self._ms_logs = False
        self._feeds_since_bound = 0
        self._version = 0
        self._ledger: tuple[int, KvBlockLedger] | None = None
        self._preempted: tuple[int, list[InferredPreemption], list[InferredPreemption]] | None = None  # all, actionable
        self._budget: tuple[int, int, bool] | None = None  # (version, the inferred token budget, from a cut step)
        self._exact = ExactSteps(max_steps, max_requests)  # the step plugin's facts (exact mode), when it reports
        self._overlaid: tuple[int, list[tuple[StepInput, StepOutcome]]] | None = None
        self.skipped: dict[str, int] = {}
        # spans that admitted their request before any log line named it, with the `Received` line that came
        # after (live, a short request's span can beat the log's 0.1 s poll): if `Added` lines then name it an
        # n>1 parent, its children take its place (`_early_parent`). The last MAX_EARLY_SPANS.
        self._early: OrderedDict[str, tuple[list[RequestSpan], RequestReceived | None]] = OrderedDict()
        self._early_kids: OrderedDict[str, list[RequestSpan]] = OrderedDict()  # such spans, for the next children
        self.moved_spans: list[tuple[RequestSpan, str]] = []  # (span, the child it went to) since the caller took them

    # ---- input -------------------------------------------------------------------------------------------
    def feed(self, event: Event) -> None:
        self._version += 1
        if isinstance(event, EngineStep):
            self._on_step(event)
        elif isinstance(event, MetricsSnapshot):
            self._on_metrics(event)
        elif isinstance(event, RequestReceived | RequestAdded | RequestAborted | RequestFailed | RequestSpan):
            self._on_request(event)
        elif isinstance(event, GpuSample):
            self.gpu.add(event)
        elif isinstance(event, SchedulerStep | SchedulerHello):
            if event.engine == self.engine:
                self._exact.add(event)
            else:
                self._skip("other_engine_plugin_step")
        elif isinstance(event, TokenBudgetLine):
            self._on_budget(event)
        else:
            self._skip(type(event).__name__)
        self._feeds_since_bound += 1
        if self._feeds_since_bound >= BOUND_EVERY_FEEDS or self._window.over_capacity():
            self._feeds_since_bound = 0
            self._bound()

    def feed_all(self, events: Iterable[Event]) -> None:
        for event in events:
            self.feed(event)

    def _skip(self, kind: str) -> None:
        self.skipped[kind] = self.skipped.get(kind, 0) + 1

    def _log_time(self, log_ts: float | None, ts: float) -> float:
        """vLLM's own stamp when it has sub-second resolution; the default 1 s stamps are worse than receipt."""
        if log_ts is None:
            return ts
        if log_ts % 1.0:
            self._ms_logs = True
        return log_ts if self._ms_logs else ts

    def _on_step(self, ev: EngineStep) -> None:
        if ev.engine != self.engine or ev.dummy:
            self._skip("other_engine_or_dummy_step")
            return
        if self._last_iteration is not None and ev.iteration < self._last_iteration:
            self._vllm_restarted()
        self._last_iteration = ev.iteration
        end = max(self._log_time(ev.log_ts, ev.ts), self._window.last_end() or float("-inf"))
        self._window.append(StepInput(self._window.next_seq, ev.engine, ev.iteration, end, ev.elapsed_ms / 1000.0,
                                      ev.context_requests, ev.context_tokens, ev.generation_requests,
                                      ev.generation_tokens, ev.kv_usage))

    def _on_budget(self, ev: TokenBudgetLine) -> None:
        """vLLM said its budget at start-up: the step inference reads a step under it as not full from the first
        step on, and a whale is re-simulated and forecast in chunks of it before any step fills it (a budget taken
        from the largest step seen is 2,048 until a long prompt comes, a quarter of a large GPU's 8,192). The
        operator's `token_budget` still wins; a restarted vLLM's line replaces the last."""
        if self._configured_budget is None:
            self._announced_budget = ev.token_budget
            self._budget_saved = False
            self._announced_at = self._window.next_seq
            self._inference.announce_budget(ev.token_budget)

    def _vllm_restarted(self) -> None:
        """A step whose iteration went back: a new vLLM. A budget announced before the old one's last step is the old
        one's (a vLLM started on its default budget logs no line): forgotten, the steps' inference answers again."""
        if self._announced_budget is not None and self._announced_at < self._window.next_seq:
            self._announced_budget, self._budget_saved = None, False

    def restore_budget(self, token_budget: int) -> bool:
        """A budget vLLM announced to an earlier agent (agent/budget_store.py), taken as announced when neither the
        setting nor a line read since gives one; False when one does."""
        if self._configured_budget is not None or self._announced_budget is not None:
            return False
        self._version += 1
        self._announced_budget, self._budget_saved = token_budget, True
        self._announced_at = self._window.next_seq
        self._inference.announce_budget(token_budget)
        return True

    def _on_metrics(self, ev: MetricsSnapshot) -> None:
        if ev.engine != str(self.engine):
            self._skip("other_engine_metrics")
            return
        geo = Geometry(self._fixed.block_size or ev.block_size, self._fixed.num_blocks or ev.num_gpu_blocks)
        if geo != self._inference.geometry and geo.known:
            self._inference.set_geometry(geo)
        self._samples.append(MetricsSample(ev.ts, ev.kv_usage, ev.preemptions_total, ev.counter_reset))

    def _on_request(self, ev: RequestReceived | RequestAdded | RequestAborted | RequestFailed | RequestSpan) -> None:
        if not isinstance(ev, RequestSpan) and ev.log_ts is not None:
            log_ts = self._log_time(ev.log_ts, ev.ts)
            if log_ts != ev.log_ts:  # a copy only when the stamp changes (1 s stamps: receipt time instead)
                ev = replace(ev, log_ts=log_ts)
        early = self._early_parent(ev.request_id) if isinstance(ev, RequestAdded) and self._early else None
        if early is not None:
            self._readmit_as_parent(early)
        change = self._book.feed(ev)
        entry = self._book.entry(change.request_id)  # an n>1 parent's span: the child it went to
        if entry is not None and (change.span_landed or change.new or change.aborted):
            self._inference.request_changed(change.request_id, entry.queue_ts,
                                            span_landed=change.span_landed and not (change.new or change.aborted))
        if isinstance(ev, RequestSpan) and change.new:
            self._early[ev.request_id] = ([ev], None)
            while len(self._early) > MAX_EARLY_SPANS:
                self._early.popitem(last=False)
        elif isinstance(ev, RequestSpan) and (got := self._early.get(ev.request_id)) is not None:
            if change.request_id == ev.request_id and all(sp.span_id != ev.span_id for sp in got[0]):
                got[0].append(ev)  # another child's span, before the log named the children (not a repeat)
        elif isinstance(ev, RequestReceived) and ev.request_id in self._early:
            self._early[ev.request_id] = (self._early[ev.request_id][0], ev)
        if early is not None:
            self._early_kids[early[0][0].request_id] = early[0]
            while len(self._early_kids) > MAX_EARLY_SPANS:
                self._early_kids.popitem(last=False)
        if isinstance(ev, RequestAdded) and self._early_kids and change.new:
            self._span_to_child(change.request_id)

    def _span_to_child(self, child: str) -> None:
        """A newly added n>1 child takes the next of the spans its parent's name brought before the log named it
        (spans of alike children: which goes to which changes no step)."""
        m = CHILD_PREFIX.fullmatch(child)
        spans = self._early_kids.get(m["parent"]) if m is not None else None
        if not spans:
            return
        span = spans.pop(0)
        if not spans:
            del self._early_kids[span.request_id]
        self._on_request(span)
        if (got := self._book.last_span_request) and got != span.request_id:
            self.moved_spans.append((span, got))

    def _early_parent(self, child: str) -> tuple[list[RequestSpan], RequestReceived | None] | None:
        """For the `Added` line of an n>1 child whose parent a span admitted first (and no child yet): that span
        and the parent's `Received` line; else None."""
        m = CHILD_PREFIX.fullmatch(child)
        if m is None or m["parent"] not in self._book or self._book.children(m["parent"]):
            return None
        return self._early.pop(m["parent"], None)

    def _readmit_as_parent(self, early: tuple[list[RequestSpan], RequestReceived | None]) -> None:
        """The lifecycle a parent's span made before the log named its children leaves (the steps re-inferred
        without it); its `Received` line (else the span's start) waits for the children, as in log order."""
        span, received = early[0][0], early[1]
        entry = self._book.entry(span.request_id)
        self._book.forget(span.request_id)
        if entry is not None:
            self._inference.request_changed(span.request_id, entry.queue_ts)
        self._inference.forget(span.request_id)
        self._book.feed(received if received is not None else RequestReceived(
            ts=span.start_ts, log_ts=span.start_ts, request_id=span.request_id, max_tokens=span.max_tokens))

    def client_of(self, request_id: str) -> str:
        """The client request `request_id` is part of: an n>1 child's parent (while the book holds it), else itself."""
        return self._book.client_of(request_id)

    def clients(self) -> dict[str, str]:
        """Each n>1 child the book holds -> its parent (the client request); empty without n>1 traffic."""
        return self._book.clients()

    def children(self, parent: str) -> tuple[str, ...]:
        """An n>1 request's children the book holds, in child order (empty for any other id)."""
        return self._book.children(parent)

    # ---- bounds ------------------------------------------------------------------------------------------
    def _bound(self) -> None:
        """Drop what no open request overlaps (and is older than keep_s), or the oldest past max_steps."""
        last = self._window.last_end()
        if last is None:
            return
        self._book.expire_unadmitted(last - self._book.admit_window_s)
        self._infer_through(last - self._open_timeout_s)  # every departure a timeout can close is known
        horizon = last - self._keep_s
        for entry in self._book.open_entries():  # an open request holds the window from its queueing
            lc = entry.lifecycle
            if entry.queue_ts < horizon and lc.end_ts is None and not self._closed_by_timeout(lc.request_id, last):
                horizon = entry.queue_ts
        self.forget_before(horizon)
        if self._window.over_capacity():
            self._inference.refresh()
            self._evict(self._window.evictable(None))

    def _infer_through(self, ts: float) -> None:
        """Infer the steps ending by `ts` and the next one: what eviction before `ts` (its checkpoint) and the
        departures ending before it read. The newer steps wait for a reader that needs them, by when more spans
        have landed (fewer re-inferences: a span landing on steps not inferred yet costs none)."""
        after = self._window.first_seq_ending_after(ts)
        self._inference.refresh(None if after is None else after + 1)

    def _closed_by_timeout(self, rid: str, now: float) -> bool:
        """An inferred finish whose span never came (lost, or tracing off) stops holding the window open."""
        departed = self._inference.departure(rid)
        return departed is not None and now - departed.end_ts > self._open_timeout_s

    def forget_before(self, ts: float) -> None:
        """Forget steps that ended before `ts` (in whole checkpoint chunks), the samples before it, and the
        requests that ended before the oldest step still held (re-inference from there may need the others)."""
        self._infer_through(ts)
        self._evict(self._window.evictable(ts))
        while self._samples and self._samples[0].ts < ts:
            self._samples.popleft()
        self.gpu.forget_before(ts)
        first = self._window.start_of(self._window.first_seq)
        cutoff = ts if first is None else min(ts, first)
        for entry in self._book.entries():
            lc = entry.lifecycle
            end = lc.end_ts
            if end is None and self._closed_by_timeout(lc.request_id, cutoff):
                departed = self._inference.departure(lc.request_id)
                end = None if departed is None else departed.end_ts
            if end is not None and end < cutoff:
                self._book.forget(lc.request_id)
                self._inference.forget(lc.request_id)

    def _evict(self, upto_seq: int | None) -> None:
        if upto_seq is not None and upto_seq > self._window.first_seq:
            self._inference.drop_before(upto_seq)
            self._version += 1

    # ---- queries -----------------------------------------------------------------------------------------
    def lifecycle(self, request_id: str) -> RequestLifecycle | None:
        """vLLM's times once the span has landed; before that, what the log lines and steps show."""
        self._inference.refresh()
        lc = self._book.get(request_id)
        if lc is None:
            return None
        return lc if lc.complete else self._partial(lc)

    def span_owner(self, span: RequestSpan) -> str | None:
        """The lifecycle `span` (just fed) went to: its own id, or for an n>1 parent's span the child it was given
        (None when every child had one already: a repeated export)."""
        kids = self._book.children(span.request_id)
        if not kids or span.request_id in self._book:
            return span.request_id
        got = self._book.last_span_request
        return got if got in kids else None

    def logged(self, request_id: str) -> RequestLifecycle | None:
        """What the log lines and the span say of the request, no step inferred for it: a status read asked many
        times a second (API lookups) must not force the inference, whose re-inference grows with how often it
        runs between spans."""
        return self._book.get(request_id)

    def lost_in_restart(self, request_id: str) -> bool:
        """Whether the steps show the request ended with a vLLM that restarted under it (what `lifecycle` reports
        as its abort time); infers the steps only when a step held follows a restart."""
        if not self._window.holds_restart():
            return False
        self._inference.refresh()
        departed = self._inference.departure(request_id)
        return departed is not None and departed.reason == "restart"

    def cached_tokens(self, request_id: str) -> int:
        """Prompt tokens the request found in vLLM's prefix cache (inferred from the steps; 0 if none seen)."""
        departed = self._inference.departure(request_id)
        track = self._inference.track(request_id) if departed is None else None
        cached = departed.cached if departed is not None else track.cached if track is not None else None
        return cached or 0

    def prefilled_tokens(self, request_id: str) -> int:
        """Prompt tokens vLLM has computed for a request still prefilling, in its chunks so far (prefix hits not
        counted): a floor on a prompt the steps have not seen end. 0 once it departed or when not tracked."""
        track = self._inference.track(request_id)
        return track.prefilled if track is not None else 0

    def received(self, now: float) -> list[RequestLifecycle]:
        """Requests vLLM logged `Received` for that have not entered the engine by `now` (no `Added` line yet):
        never queued here, but the engine will have them unless vLLM rejects them (`LifecycleBook.received`)."""
        return self._book.received(now)

    def lifecycles(self) -> list[RequestLifecycle]:
        """Every held lifecycle in queue order, those without a span completed from the steps (`lifecycle`)."""
        self._inference.refresh()
        out = self._book.lifecycles()
        for i, lc in self._book.incomplete():
            out[i] = self._partial(lc)
        return out

    def _partial(self, lc: RequestLifecycle) -> RequestLifecycle:
        departed = self._inference.departure(lc.request_id)
        source = departed if departed is not None else self._inference.track(lc.request_id)
        if source is None:
            return lc
        w = self._window
        finish = departed.end_ts if departed is not None and departed.reason == "finished" else None
        # vLLM restarted under it: no span and no abort line will ever come, it ended with the old server
        lost = departed.end_ts if departed is not None and departed.reason == "restart" else None
        return replace(lc, scheduled_ts=lc.scheduled_ts or w.start_of(source.admitted_seq),
                       first_token_ts=lc.first_token_ts or w.end_of(source.first_token_seq),
                       finish_ts=lc.finish_ts or finish, prompt_tokens=lc.prompt_tokens or source.prompt,
                       aborted_ts=lc.aborted_ts or lost)

    def outcomes(self) -> list[tuple[StepInput, StepOutcome]]:
        """Every step held with what was inferred for it (departures, preemptions, KV holdings)."""
        self._inference.refresh()
        if not self.exact_reported:
            return self._window.outcomes()
        if self._overlaid is None or self._overlaid[0] != self._version:
            self._overlaid = (self._version, self._exact.overlay(self._window.outcomes(), self._prompt_of,
                                                                  self._inference.geometry.block_size))
        return list(self._overlaid[1])

    def _prompt_of(self, rid: str) -> int | None:
        lc = self._book.get(rid)
        return None if lc is None else lc.prompt_tokens

    def mode(self, t0: float | None = None, t1: float | None = None) -> str:
        """`exact` when the step plugin reported every held step overlapping [t0, t1] (all steps without
        bounds), else `inferred`: which mode produced an answer about that span."""
        if not self.exact_reported:
            return "inferred"
        lo, hi = float("-inf") if t0 is None else t0, float("inf") if t1 is None else t1
        held = self._window.held_outcomes()
        first = bisect_left(held, lo, key=_end_of)  # the steps' ends never go back (`_on_step`): none before ends in it
        steps = [si for si, _ in held[first:] if si.start_ts <= hi]
        return "exact" if steps and all(self._exact.get(si.iteration) is not None for si in steps) else "inferred"

    @property
    def exact_reported(self) -> bool:
        """Whether the step plugin has reported steps (exact mode is on and its messages arrive)."""
        return len(self._exact) > 0

    def cached_prompt_tokens(self, request_id: str) -> int | None:
        """Prompt tokens vLLM found in its prefix cache for the request (exact mode only; None otherwise)."""
        return self._exact.cached_tokens(request_id)

    def last_step_end(self) -> float | None:
        """When the latest step held ended: how far the steps have told what happened."""
        return self._window.last_end()

    @property
    def log_stamped(self) -> bool:
        """Step ends are vLLM's own sub-second log stamps (not receipt times), so they order with span ends: vLLM
        logs a step's line after ending the spans of the requests it finished (`AsyncLLM.output_handler`)."""
        return self._ms_logs

    def steps(self) -> list[StepRecord]:
        """The records of `outcomes()`; inferred, a copy of the list the window keeps (no walk of the window)."""
        self._inference.refresh()
        if not self.exact_reported:
            return self._window.records()
        return [out.record for _, out in self.outcomes()]

    def step_ends(self) -> list[float]:
        """`[s.end_ts for s in steps()]`, from the window's own list (the plugin's facts keep the times)."""
        self._inference.refresh()
        return self._window.ends()

    def steps_between(self, t0: float, t1: float) -> list[StepRecord]:
        """Steps whose execution overlaps [t0, t1], members included."""
        return [out.record for si, out in self.outcomes() if si.end_ts >= t0 and si.start_ts <= t1]

    @property
    def ledger(self) -> KvBlockLedger:
        outcomes = self.outcomes()
        if self._ledger is None or self._ledger[0] != self._version:
            lifetimes = {lc.request_id: (lc.arrival_ts, lc.end_ts) for lc in self._book.lifecycles()}
            self._ledger = (self._version, KvBlockLedger(self._inference.geometry, outcomes, list(self._samples),
                                                         lifetimes))
        return self._ledger[1]

    def block_seconds(self, request_ids: Iterable[str]) -> dict[str, float]:
        """KV block-seconds of these requests over the steps held (the ledger's figures, the ledger not built)."""
        outcomes, ids = self.outcomes(), set(request_ids)
        held = None if self.exact_reported else self._inference.held_between(ids)
        if held is None:  # a request the inference does not know (or the plugin's holdings): every step
            return block_seconds(outcomes, ids)
        first = self._window.first_seq  # only the steps that can hold them: the same terms in the same order
        return block_seconds(outcomes, ids, max(held[0] - first, 0), held[1] - first + 1)

    def kv_latest(self) -> KvLatest:
        """The ledger's latest step, holdings and sample reconciliation, without building the ledger."""
        outcomes = self.outcomes()  # the plugin's overlay keeps the steps' times: the window's ends are theirs too
        return kv_latest(self._inference.geometry, outcomes, self._samples, self._window.ends())

    def preemptions(self) -> list[InferredPreemption]:
        """Inferred once per timeline version (like the ledger): the timeline view, the counters and each settle
        read them, and the inference walks every step held."""
        self._inference.refresh()
        if self._preempted is None or self._preempted[0] != self._version:
            exact = self.outcomes() if self.exact_reported else None
            found = infer_preemptions(self._window.held_outcomes() if exact is None else exact,  # read, not kept
                                      list(self._samples), self._book.by_id(), in_order=True,
                                      eventful=None if exact is not None else self._window.eventful(),
                                      end_ms=self._window.ends_ms())
            found = found if exact is None else certain(found, exact_iterations(exact, self._exact))
            self._preempted = (self._version, found, [p for p in found if p.actionable])
        return list(self._preempted[1])

    def actionable_preemptions(self) -> list[InferredPreemption]:
        """`preemptions()` an operator may act on (`InferredPreemption.actionable`), sorted out once per version:
        what is counted, blamed as `preemption` and exported on spans."""
        self.preemptions()
        return list(self._preempted[2]) if self._preempted is not None else []

    def preemption_counts(self) -> PreemptionCounts:
        return preemption_counts(self.preemptions(), list(self._samples))

    @property
    def geometry(self) -> Geometry:
        """The KV pool: the settings, else what `vllm:cache_config_info` showed (once both parts are known)."""
        return self._inference.geometry

    def pool(self) -> tuple[int | None, int | None]:
        return self._inference.geometry.block_size, self._inference.geometry.num_blocks

    def token_budget(self) -> int:
        """vLLM's max_num_batched_tokens: as configured; else as vLLM's start-up line said; else the size of a
        step that cut a prefill chunk (the request is still in prefill in the next step: that step was full); else
        the largest step seen, but at least DEFAULT_TOKEN_BUDGET, the smallest default of vLLM's API servers on GPU
        and CPU (short traffic never fills a step: a stream of 32-token prompts showed 42, and a whale re-simulated
        or forecast with that budget ran 42 tokens a step). The one rule the attribution and the forecast read."""
        if self._configured_budget is not None:
            return self._configured_budget
        if self._announced_budget is not None:
            return self._announced_budget
        if self._budget is None or self._budget[0] != self._version:  # once a version
            self._inference.refresh()
            if not self.exact_reported:  # the window keeps each pair's answer until one of the two is re-inferred
                full = self._window.cut_max(_cut_size)
            else:  # the plugin's facts rewrite records outside the window's kept lists (the lab's exact mode)
                steps = self.steps()
                full = max((_cut_size(a, b) for a, b in zip(steps, steps[1:], strict=False)), default=0)
            self._budget = (self._version, full or max(self._window.largest_step(), DEFAULT_TOKEN_BUDGET), full > 0)
        return self._budget[1]

    def token_budget_source(self) -> str:
        """Where `token_budget` comes from: `configured` (the setting), `announced` (vLLM's start-up line), `saved`
        (that line as an earlier agent read it, kept in its state_dir), `inferred` (a step that cut a prefill
        chunk) or `guessed` (no such step yet: the largest step, at least DEFAULT_TOKEN_BUDGET), so an operator can
        tell a budget known from one the agent may have wrong."""
        if self._configured_budget is not None:
            return "configured"
        if self._announced_budget is not None:
            return "saved" if self._budget_saved else "announced"
        self.token_budget()
        return "inferred" if self._budget is not None and self._budget[2] else "guessed"

    def membership_quality(self) -> MembershipQuality:
        if not self.exact_reported:  # kept by the window as outcomes change
            self._inference.refresh()
            n, exact, total, worst = self._window.membership()
            if not n:
                return MembershipQuality(0, 0.0, 0.0, 0)
            return MembershipQuality(n, exact / n, total / n, worst)
        errors = [r.membership_error for r in self.steps()]
        if not errors:  # no iteration log, no evidence: a result built on guessed steps must not read as good
            return MembershipQuality(0, 0.0, 0.0, 0)
        return MembershipQuality(len(errors), sum(e == 0 for e in errors) / len(errors),
                                 sum(errors) / len(errors), max(errors))

    def sizes(self) -> dict[str, int]:
        """How much is held, for the memory-bound tests and the agent's own metrics."""
        return {"steps": len(self._window), "requests": len(self._book), "samples": len(self._samples),
                "departed": self._inference.departures(), "checkpoints": self._window.checkpoints(),
                "unadmitted": self._book.unadmitted(), "plugin_steps": len(self._exact)}

    def inference_work(self) -> tuple[int, int, int]:
        """(steps fed, step inferences run, of which re-inferences): what a late span costs (benchmarks)."""
        return self._window.next_seq, self._inference.inferred, self._inference.reinferred

    def never_admitted(self) -> tuple[int, int]:
        """(calls that never use the engine, received ids that left without entering it): not requests here."""
        return self._book.non_generation, self._book.never_admitted


def _end_of(pair: tuple[StepInput, StepOutcome]) -> float:
    return pair[0].end_ts


def _cut_size(step: StepRecord, after: StepRecord) -> int:
    """The step's size when it cut a prefill chunk (a request in prefill in it is still in prefill after), else 0."""
    still = {m.request_id for m in after.members if m.phase == "prefill"}
    if any(m.phase == "prefill" and m.request_id in still for m in step.members):
        return step.context_tokens + step.generation_tokens
    return 0
