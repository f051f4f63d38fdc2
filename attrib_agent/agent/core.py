"""The agent process: live sources (or a replay) -> one bounded queue -> the pure pipeline -> sinks.

Everything runs on one asyncio loop, so the pipeline and the state the API reads are never touched from two
threads. Sources only enqueue typed events; the consumer feeds them to the pipeline in arrival order and
hands the results to every registered sink (`sinks/registry.py`) through one multi-sink. A full queue drops events and
counts them (skipped `queue_full` on the `pipeline` source) instead of growing without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from prometheus_client import make_asgi_app
from starlette.types import Message

from attrib_agent.agent.gc_freeze import GcFreezer
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import Event
from attrib_agent.http_server import start_server
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.read_model import AgentState
from attrib_agent.sinks import registry as sink_registry
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.api.render_cache import CachedAsgi, RenderCache
from attrib_agent.sinks.journal import JournalSink
from attrib_agent.sinks.journal import sink as journal_sink
from attrib_agent.sinks.prometheus.collector import registry_for
from attrib_agent.sinks.sink import MultiSink, Sink

logger = logging.getLogger("attrib_agent")

MAX_QUEUED_EVENTS = 100_000
SINK_FLUSH_S = 0.5  # "a restart loses at most the last second"
IDLE_SETTLE_S = 0.5  # live, with no events arriving (vLLM down), still attribute what is due
METRICS_MAX_AGE_S = 1.0  # a /metrics body is reused for at most this long (and only while the state is unchanged)
READS_MAX_STALE_S = 1.0  # /v1/timeline, /v1/culprits/top bodies served up to this old, changes since or not


@dataclass(frozen=True)
class ServeOptions:
    """Where and how the API listens."""

    host: str = "127.0.0.1"
    port: int = 9400
    token: str | None = None


class AgentCore:
    """The pipeline and its sinks, without any source: fed by live sources or by a replay."""

    def __init__(self, pipeline: AttributionPipeline, *, sinks: Sequence[Sink] = (),
                 clock: Callable[[], float] = time.time, max_queued: int = MAX_QUEUED_EVENTS) -> None:
        self.state = AgentState(pipeline, clock=clock)
        self._health = self.state.source("pipeline")
        self.sinks = MultiSink(sinks, on_error=lambda name: self._health.skip(f"{name}_error"))
        journal = self.sinks.get(journal_sink.NAME)
        self.journal = journal.journal if isinstance(journal, JournalSink) else None
        self._queue: asyncio.Queue[Event] | None = None
        self._max_queued = max_queued
        self.results_out = 0
        self._forecast_settle = -1  # the settle the forecast's snapshot was last built for
        # Live: a wall-clock idle settle attributes what is due while vLLM is down. A replay settles on event time
        # only (`replay_into` turns this off): a wall-clock settle would land at a different event on a busy machine
        # and change the results from run to run.
        self.settle_when_idle = True

    @classmethod
    def from_config(cls, cfg: AgentConfig, *, live: bool, clock: Callable[[], float] = time.time) -> AgentCore:
        """The pipeline the settings describe, with every registered sink they turn on (a replay runs only the
        sinks registered `in_replay`)."""
        core = cls(AttributionPipeline(cfg.pipeline_config()), clock=clock)
        core.state.forecast_settings = cfg.forecast_settings()
        for spec in sink_registry.SINKS:
            if live or spec.in_replay:
                sink = spec.build(cfg, core.state)
                if sink is not None:
                    core.add_sink(sink)
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
        for r in self.journal.load(since_ts=self.state.clock() - cfg.max_result_age_s, max_results=cfg.max_results):
            self.pipeline.store.put(r)
            self.pipeline.version += 1
            n += 1
        return n

    # ---- intake ------------------------------------------------------------------------------------------
    def submit(self, event: Event) -> None:
        """Enqueue from a source callback; never blocks, never raises."""
        if self._queue is None:
            self._queue = asyncio.Queue()
        if self._queue.qsize() >= self._max_queued:
            self._health.skip("queue_full")
            return
        self._queue.put_nowait(event)

    def submit_many(self, events: Iterable[Event]) -> None:
        for ev in events:
            self.submit(ev)

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
        """Drain the queue into the pipeline until `stop`; flush the journal and settle when idle."""
        if self._queue is None:
            self._queue = asyncio.Queue()
        queue = self._queue
        last_flush = time.monotonic()
        while not stop.is_set():
            try:
                ev = await asyncio.wait_for(queue.get(), timeout=IDLE_SETTLE_S)
            except TimeoutError:
                if self.settle_when_idle:
                    self.settle()
                ev = None
            if ev is not None:
                self.process(ev)
                for _ in range(min(queue.qsize(), 256)):  # a batch, then yield to the API and receivers
                    self.process(queue.get_nowait())
                self._health.success(self.state.clock())
                self.refresh_forecast()  # a no-op unless the batch settled: then the forecast's snapshot, here
            if time.monotonic() - last_flush >= SINK_FLUSH_S:
                self.flush()
                last_flush = time.monotonic()
            await asyncio.sleep(0)
        while not queue.empty():
            self.process(queue.get_nowait())
        self.settle()
        self.flush()

    def refresh_forecast(self) -> None:
        """After each settle, the forecast's snapshot (state, the future without a candidate, the reference
        whale's answer for the gauge), here rather than in the first request or scrape after it: a request
        then costs its own candidate's run only. A no-op when no settle ran since (a forecast bug is counted and
        skipped like a pipeline one: the gauge then computes it at the scrape)."""
        if self.pipeline.last_event_ts is None or self.pipeline.settles == self._forecast_settle:
            return
        self._forecast_settle = self.pipeline.settles  # tried once per settle, failing or not
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

    # ---- serving -----------------------------------------------------------------------------------------
    def asgi_app(self, token: str | None) -> Any:
        # The API's GZipMiddleware compresses /metrics like every other route; prometheus_client's own gzip
        # beneath it would encode the body twice (Starlette >= 1.0 does not skip an encoded response).
        metrics = make_asgi_app(registry_for(self.state), disable_compression=True)
        # A scrape reads the clock too (lag, gap seconds): a body is reused for one state version and <= 1 s.
        cache: RenderCache[list[Message]] = RenderCache(lambda: self.pipeline.version, max_age_s=METRICS_MAX_AGE_S)
        return api_app(self.state, token=token, metrics_app=CachedAsgi(metrics, cache),
                       max_stale_s=READS_MAX_STALE_S)

    async def serve(self, opts: ServeOptions, stop: asyncio.Event,
                    started: Callable[[int], None] | None = None) -> None:
        """Serve the API until `stop`; `started(port)` once listening (port 0 picks a free one)."""
        # What exists now (the store restored from the journal, the parsers' tables, imported modules) lives as
        # long as the agent: frozen, full collections no longer walk it (a ~100,000-result store: ~1M objects);
        # what arrives later is frozen every 30 s once it survived a collection (gc_freeze.py).
        freezer = GcFreezer()
        freezer.start()
        server, task, port = await start_server(self.asgi_app(opts.token), opts.host, opts.port, "API server")

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
        with contextlib.suppress(asyncio.CancelledError):
            await task
