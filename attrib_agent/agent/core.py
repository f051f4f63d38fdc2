"""The agent process: live sources (or a replay) -> one bounded queue -> the pure pipeline -> sinks.

Sources enqueue typed events on the asyncio loop, which also serves the API and the OTLP receivers. Live
(`threaded`), the pipeline runs on one worker thread fed batch by batch from the queue: the loop only receives
and answers, so a settle that re-simulates for a second never makes an OTLP export or a lookup wait. Everything
else that reads the pipeline (the API's heavier bodies, /metrics) runs on that same thread between batches
(`AgentState.read`), so the pipeline is never read halfway through an event and needs no locks; lookups of
stored results read the store's dict directly. Without `threaded` (a replay, tests) all of it runs inline on the
loop. A full queue drops events and counts them (skipped `queue_full` on the `pipeline` source) instead of growing
without bound; a stream faster than the pipeline's CPU budget is shed (agent/shedding.py), not queued.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from attrib_agent.agent import fit_store
from attrib_agent.agent.gc_freeze import GcFreezer
from attrib_agent.agent.shedding import MIN_SHARE, Shedder, pass_budget_s
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import Event, RequestSpan
from attrib_agent.http_server import start_server
from attrib_agent.pipeline import MAX_PASS_WAIT_S, AttributionPipeline
from attrib_agent.read_model import AgentState, Backlog, inline
from attrib_agent.sinks import registry as sink_registry
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.api.render_cache import refresh_forever
from attrib_agent.sinks.journal import JournalSink
from attrib_agent.sinks.journal import sink as journal_sink
from attrib_agent.sinks.prometheus.collector import split_registries
from attrib_agent.sinks.prometheus.exposition import MetricsEndpoint
from attrib_agent.sinks.sink import MultiSink, Sink
from attrib_agent.sources.log.source import LogRecordParser, LogSource

logger = logging.getLogger("attrib_agent")

MAX_QUEUED_EVENTS = 100_000
SINK_FLUSH_S = 0.5  # "a restart loses at most the last second"
IDLE_SETTLE_S = 0.5  # live, with no events arriving (vLLM down), still attribute what is due
# /metrics' pipeline part (exposition.py) reads no clock (the live part does: lag, gap seconds), so it is reused
# while the state version is unchanged; rebuilt ahead at most every METRICS_AHEAD_S while scraped (was: at every
# refresher tick, ~3 a second at GPU rates, 10-30 ms each), never served older than METRICS_STALE_S (a scrape waits
# for the build then); a scrape that finds it out of date asks for a build and waits `fresh_wait_s` (0.1 s) for it.
METRICS_AHEAD_S = 2.5
METRICS_STALE_S = 5.0
READS_MAX_STALE_S = 1.0  # /v1/timeline, /v1/culprits/top bodies served up to this old, changes since or not
REFRESH_S = 0.25  # how often the bodies asked for lately are checked and rebuilt when no longer fresh
SERVE_STALE_S = 30.0  # past those bounds, a body this young is still served while its successor is built
# (the pipeline thread may be in a long attribution pass: a scrape gets the last body rather than a timeout)
SWITCH_INTERVAL_S = 0.001
BATCH_MAX = 512  # events handed to the pipeline thread at once
BATCH_S = 0.05  # ... and at most this long on it, so reads queued behind a batch wait little
STOP_DRAIN_S = 5.0  # at stop, what is still queued is fed for at most this long; the rest is counted and dropped


@dataclass(frozen=True)
class ServeOptions:
    """Where and how the API listens."""

    host: str = "127.0.0.1"
    port: int = 9400
    token: str | None = None


class AgentCore:
    """The pipeline and its sinks, without any source: fed by live sources or by a replay."""

    def __init__(self, pipeline: AttributionPipeline, *, sinks: Sequence[Sink] = (),
                 clock: Callable[[], float] = time.time, max_queued: int = MAX_QUEUED_EVENTS,
                 threaded: bool = False, budget_cores: float | None = None) -> None:
        self.state = AgentState(pipeline, clock=clock)
        self.state.backlog = self.backlog
        self._health = self.state.source("pipeline")
        self.sinks = MultiSink(sinks, on_error=lambda name: self._health.skip(f"{name}_error"))
        journal = self.sinks.get(journal_sink.NAME)
        self.journal = journal.journal if isinstance(journal, JournalSink) else None
        self._queue: deque[tuple[float, Event]] = deque()  # (monotonic time received, event)
        self._arrived: asyncio.Event | None = None
        self._in_flight: tuple[int, float] | None = None  # (events, oldest's monotonic time) on the pipeline thread
        self._max_queued = max_queued
        self._worker: ThreadPoolExecutor | None = None
        self._threaded = False
        self.threaded = threaded
        pass_s = pass_budget_s(pipeline.config.settle_interval_s, MAX_PASS_WAIT_S)
        self.shedder = Shedder(budget_cores, pass_s) if budget_cores is not None else None
        if self.shedder is not None:  # from the first pass on: bounded by what a victim costs (one, unmeasured)
            pipeline.floor_share = MIN_SHARE  # victims chosen at the floor are never held back by that bound
            self._bound_passes()
        self._received: dict[str, float] = {}  # span -> monotonic time received, until its final result (bounded)
        # Told each span's (request id, receipt time) as it arrives, on the thread the sources run on: the log
        # parser forgets a finished request's ids by it (vLLM logs no line for a normal finish).
        self.span_seen: list[Callable[[str, float], None]] = []
        self.results_out = 0
        self._forecast_settle = -1  # the settle the forecast's snapshot was last built for
        self._forecast_ts = float("-inf")  # ... and the event time then
        # Live: a wall-clock idle settle attributes what is due while vLLM is down. A replay settles on event time
        # only (`replay_into` turns this off): a wall-clock settle would land at a different event on a busy machine
        # and change the results from run to run.
        self.settle_when_idle = True
        # The process's collector passes (gc_freeze.py), wall clock: ticked by whichever of `consume` (live and
        # `attrib-agent replay` both run it) and `serve` runs; one freezer, so two loops never double the passes.
        self.freezer = GcFreezer()

    @classmethod
    def from_config(cls, cfg: AgentConfig, *, live: bool, clock: Callable[[], float] = time.time) -> AgentCore:
        """The pipeline the settings describe, with every registered sink they turn on (a replay runs only the
        sinks registered `in_replay`)."""
        core = cls(AttributionPipeline(cfg.pipeline_config()), clock=clock, threaded=live,
                   budget_cores=cfg.attribution_budget_cores if live else None)
        core.state.forecast_settings = cfg.forecast_settings()
        for spec in sink_registry.SINKS:
            if live or spec.in_replay:
                sink = spec.build(cfg, core.state)
                if sink is not None:
                    core.add_sink(sink)
        fit_store.attach(cfg, core)  # the step-cost fit kept across restarts (state_dir)
        return core

    def add_sink(self, sink: Sink) -> None:
        self.sinks.sinks.append(sink)
        if isinstance(sink, JournalSink):
            self.journal = sink.journal

    @property
    def pipeline(self) -> AttributionPipeline:
        return self.state.pipeline

    def restore(self) -> int:
        """Serve the journal's earlier results again (the API; counters start afresh, as after any restart)."""
        if self.journal is None:
            return 0
        cfg = self.pipeline.config
        n = 0
        results, ended = self.journal.load_all(since_ts=self.state.clock() - cfg.max_result_age_s,
                                               max_results=cfg.max_results, max_ended=cfg.max_pending)
        for r in results:
            self.pipeline.store.put(r)
            self.pipeline.version += 1
            n += 1
        for rid, status in ended:  # aborted or skipped before the restart: answered so, not unknown
            self.pipeline.restore_ended(rid, status)
        return n

    # ---- threads -----------------------------------------------------------------------------------------
    @property
    def threaded(self) -> bool:
        """Whether the pipeline (and every read of it) runs on the pipeline thread rather than the loop."""
        return self._threaded

    @threaded.setter
    def threaded(self, on: bool) -> None:
        self._threaded = on
        self.state.reads = self._on_worker if on else inline

    async def _on_worker(self, fn: Callable[[], Any]) -> Any:
        if self._worker is None:
            self._worker = ThreadPoolExecutor(1, thread_name_prefix="attrib-pipeline")
            # The loop asks for the GIL on every wake-up (a request, an export); a busy pipeline thread hands it
            # over after the switch interval: 1 ms rather than Python's 5 ms, so a request waits ms, not tens.
            sys.setswitchinterval(min(sys.getswitchinterval(), SWITCH_INTERVAL_S))
        return await asyncio.get_running_loop().run_in_executor(self._worker, fn)

    # ---- intake ------------------------------------------------------------------------------------------
    def submit(self, event: Event) -> None:
        """Enqueue from a source callback (on the loop); never blocks, never raises."""
        if type(event) is RequestSpan and self.span_seen:
            self.span_arrived(event)
        if len(self._queue) >= self._max_queued:
            self._health.skip("queue_full")
            return
        self._queue.append((time.monotonic(), event))
        if self._arrived is not None:
            self._arrived.set()

    def hear_spans(self, parts: Iterable[object]) -> None:
        """The span wiring's one rule, live and replayed alike: the log's line parser hears each span as it arrives
        (`span_seen`), so it forgets a finished request's ids (vLLM logs no line for a normal finish). `parts`: the
        live sources, or a replay's record parsers; a part without a log line parser hears none."""
        for part in parts:
            parser = (part.parser if isinstance(part, LogSource)
                      else part.line_parser if isinstance(part, LogRecordParser) else None)
            if parser is not None:
                self.span_seen.append(parser.span_landed)

    def span_arrived(self, span: RequestSpan) -> None:
        """A span as it arrives (before the queue): `span_seen` is told (the log parser ends its request's ids)."""
        for tell in self.span_seen:
            tell(span.request_id, span.ts)

    def submit_many(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.submit(ev)

    def backlog(self) -> Backlog:
        """What waits for the pipeline (queued and in its hands), and what it sheds (any thread may ask)."""
        oldest: float | None = None
        with contextlib.suppress(IndexError):
            oldest = self._queue[0][0]
        flight = self._in_flight
        if flight is not None:
            oldest = flight[1]
        shed = self.shedder
        return Backlog(len(self._queue) + (flight[0] if flight is not None else 0),
                       0.0 if oldest is None else max(0.0, time.monotonic() - oldest),
                       self.pipeline.attribute_share, self.pipeline.victims_skipped,
                       shed.budget_cores if shed is not None else None, shed.cores if shed is not None else 0.0,
                       self.pipeline.slowed_attributed, self.pipeline.slowed_skipped)

    def process(self, event: Event) -> list[AttributionResult]:
        """Feed one event through the pipeline and deliver what it settled."""
        try:
            results = self.pipeline.feed(event)
        except Exception:  # a pipeline bug must not stop the agent: count it, keep the event's kind
            logger.exception("pipeline failed on a %s event; skipped", type(event).__name__)
            self._health.skip(f"pipeline_error_{type(event).__name__}")
            return []
        self.deliver(results)
        return results

    def settle(self) -> list[AttributionResult]:
        results = self.pipeline.settle()
        self.deliver(results)
        return results

    def deliver(self, results: list[AttributionResult]) -> None:
        if not results:
            return
        self.results_out += len(results)
        self.sinks.on_results(results)

    async def consume(self, stop: asyncio.Event) -> None:
        """Feed the queue to the pipeline in batches until `stop` (on the pipeline thread when `threaded`); flush
        the sinks every SINK_FLUSH_S and settle when idle."""
        queue = self._queue
        self._arrived = arrived = asyncio.Event()
        last_flush = time.monotonic()
        freezer = self.freezer
        while not stop.is_set():
            freezer.tick()  # a clock read unless a pass is due: survivors frozen about every second
            if not queue:
                arrived.clear()
                try:
                    await asyncio.wait_for(arrived.wait(), timeout=IDLE_SETTLE_S)
                except TimeoutError:
                    if self.settle_when_idle:
                        await self.state.read(self.settle)
            if queue:
                await self._feed_batch(time.monotonic() + BATCH_S)
            if time.monotonic() - last_flush >= SINK_FLUSH_S:
                await self.state.read(self.flush)
                last_flush = time.monotonic()
            await asyncio.sleep(0)  # the API and the receivers, between batches when inline
        until = time.monotonic() + STOP_DRAIN_S
        while queue and time.monotonic() < until:
            await self._feed_batch(until)
        if queue:
            logger.warning("stopping: %d queued events not fed to the pipeline", len(queue))
            self._health.skip("stopped_queued", len(queue))
            queue.clear()
        await self.state.read(self.settle)
        await self.state.read(self.flush)

    async def _feed_batch(self, deadline: float) -> None:
        """Hand up to BATCH_MAX queued events to the pipeline; what it did not reach by `deadline` goes back."""
        queue = self._queue
        batch = [queue.popleft() for _ in range(min(len(queue), BATCH_MAX))]
        self._in_flight = (len(batch), batch[0][0])
        try:
            done = await self.state.read(lambda: self._run_batch(batch, deadline))
        finally:
            self._in_flight = None
        queue.extendleft(reversed(batch[done:]))

    def _run_batch(self, batch: list[tuple[float, Event]], deadline: float) -> int:
        """On the pipeline thread: feed events until the batch or the time is up; then what follows a batch."""
        n = 0
        p, shed, received = self.pipeline, self.shedder, self._received
        for t_in, ev in batch:
            if shed is not None and p.settles_on(ev.ts):  # a pass may run: timed, for what a victim costs
                w0, c0 = time.perf_counter(), time.thread_time()
                results = self.process(ev)
                shed.learn_pass(len(results), time.perf_counter() - w0, time.thread_time() - c0)
                done = time.monotonic()
                for r in results:
                    t_span = received.pop(r.request_id, None) if r.final else None
                    if t_span is not None:
                        shed.saw_final(done - t_span)
            else:
                self.process(ev)
            if shed is not None and isinstance(ev, RequestSpan):  # when it was received, for its result's age
                received[ev.request_id] = t_in
                if len(received) > p.config.max_pending:
                    del received[next(iter(received))]
            n += 1
            if time.monotonic() >= deadline:
                break
        self._health.success(self.state.clock())
        self.refresh_forecast()  # a no-op unless the batch settled: then the forecast's snapshot, here
        self.state.mode_now = p.mode()
        if shed is not None:
            p.attribute_share = shed.update(time.monotonic(), time.process_time(), self.backlog().oldest_s,
                                            p.events["RequestSpan"], p.slowed_rescued)
            p.pass_gap_s = shed.pass_gap_s(p.config.settle_interval_s)
            self._bound_passes()
        return n

    def _bound_passes(self) -> None:
        """The pipeline's bound on a pass's victims: the freshness goal's pass time over a victim's cost so far; and
        on the visibly slowed it takes outside the share: the victims a second the budget affords."""
        p, shed = self.pipeline, self.shedder
        assert shed is not None
        p.max_pass_victims = shed.pass_cap()
        p.rescue_per_s = shed.rescue_rate()

    def refresh_forecast(self) -> None:
        """After each settle, the forecast's snapshot (state, the future without a candidate, the reference
        whale's answer for the gauge), here rather than in the first request or scrape after it: a request
        then costs its own candidate's run only. A no-op when no settle ran since (a forecast bug is counted and
        skipped like a pipeline one: the gauge then computes it at the scrape)."""
        now = self.pipeline.last_event_ts
        if now is None or self.pipeline.settles == self._forecast_settle or (
                now - self._forecast_ts < self.pipeline.pass_gap_s):  # shedding: as rarely as attribution passes
            return
        self._forecast_settle = self.pipeline.settles  # tried once per settle, failing or not
        self._forecast_ts = now
        try:
            self.state.refresh_reference()
        except Exception:
            logger.exception("reference forecast failed; skipped")
            self._health.skip("forecast_error")

    def flush(self) -> None:
        """Push out what the sinks buffered (the journal: "a restart loses at most the last second")."""
        self.sinks.flush()

    def shutdown(self) -> None:
        self.sinks.shutdown()
        self.freezer.stop()  # a process that outlives its agent (tests, lab runs) collects what it left
        if self._worker is not None:
            self._worker.shutdown(wait=True)
            self._worker = None

    # ---- serving -----------------------------------------------------------------------------------------
    def asgi_app(self, token: str | None) -> Any:
        """The API with /metrics; its heavier bodies built where the pipeline lives (`state.reads`), kept and
        served while the next is built. `app.state.renderers`: what `serve` keeps fresh ahead of requests."""
        # The pipeline part is reused for one state version; the live part (lag, gap seconds, health) is read at
        # every scrape.
        pipeline_part, live_part = split_registries(self.state)
        metrics = MetricsEndpoint(pipeline_part, lambda: self.pipeline.version, self.state.reads,
                                  max_age_s=None, serve_stale_s=METRICS_STALE_S,
                                  ahead_s=METRICS_AHEAD_S, live=live_part)
        app = api_app(self.state, token=token, metrics_app=metrics, max_stale_s=READS_MAX_STALE_S,
                      serve_stale_s=SERVE_STALE_S)
        app.state.renderers = [*app.state.renderers, metrics.renderer]
        return app

    async def serve(self, opts: ServeOptions, stop: asyncio.Event,
                    started: Callable[[int], None] | None = None) -> None:
        """Serve the API until `stop`; `started(port)` once listening (port 0 picks a free one)."""
        # What exists now (the store restored from the journal, the parsers' tables, imported modules) lives as
        # long as the agent: frozen, full collections no longer walk it (a ~100,000-result store: ~1M objects);
        # what arrives later is frozen every second once it survived a collection (gc_freeze.py). The core's one
        # freezer, also ticked by `consume`: here too, for an API served alone (benchmarks/api_load.py).
        freezer = self.freezer
        freezer.tick()  # the first tick collects and freezes, unless `consume` already did
        app = self.asgi_app(opts.token)
        server, task, port = await start_server(app, opts.host, opts.port, "API server")
        refreshing = asyncio.create_task(refresh_forever(app.state.renderers, stop, REFRESH_S), name="bodies")

        async def freeze_survivors() -> None:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), 1.0)
                freezer.tick()

        freezing = asyncio.create_task(freeze_survivors(), name="gc_freeze")
        logger.info("API listening on http://%s:%d", opts.host, port)
        if started is not None:
            started(port)
        await stop.wait()
        server.should_exit = True
        await freezing
        await refreshing
        with contextlib.suppress(asyncio.CancelledError):
            await task
