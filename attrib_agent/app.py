"""The agent process: live sources (or a replay) -> one bounded queue -> the pure pipeline -> sinks.

Everything runs on one asyncio loop, so the pipeline and the state the API reads are never touched from two
threads. Sources only enqueue typed events; the consumer feeds them to the pipeline in arrival order and
hands the results to the journal (all) and the span emitter (final ones). A full queue drops events and
counts them (skipped `queue_full` on the `pipeline` source) instead of growing without bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import uvicorn
from prometheus_client import make_asgi_app

from attrib_agent.agent_state import AgentState
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.events import Event
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.recording import LOG, METRICS, NVML, OTLP
from attrib_agent.sinks.http_api import api_app
from attrib_agent.sinks.journal import ResultJournal
from attrib_agent.sinks.otel_spans import SlowdownSpans
from attrib_agent.sinks.prom_collector import registry_for
from attrib_agent.sources.health import SourceHealth
from attrib_agent.sources.replay import ReplaySource

logger = logging.getLogger("attrib_agent")

MAX_QUEUED_EVENTS = 100_000
JOURNAL_FLUSH_S = 0.5  # "a restart loses at most the last second"
IDLE_SETTLE_S = 0.5  # with no events arriving (vLLM down), still attribute what is due
REPLAY_SOURCE_NAMES = {METRICS: "vllm_metrics", LOG: "vllm_log", OTLP: "otlp", NVML: "nvml"}


@dataclass(frozen=True)
class ServeOptions:
    """Where and how the API listens."""

    host: str = "127.0.0.1"
    port: int = 9400
    token: str | None = None


class AgentCore:
    """The pipeline and its sinks, without any source: fed by live sources or by a replay."""

    def __init__(self, pipeline: AttributionPipeline, *, journal: ResultJournal | None = None,
                 spans: SlowdownSpans | None = None, clock: Callable[[], float] = time.time,
                 max_queued: int = MAX_QUEUED_EVENTS) -> None:
        self.state = AgentState(pipeline, clock=clock)
        self.journal = journal
        self.spans = spans
        self._queue: asyncio.Queue[Event] | None = None
        self._max_queued = max_queued
        self._health = self.state.source("pipeline")
        self.results_out = 0

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
        if self.journal is not None:
            self.journal.append(results)
        if self.spans is not None:
            try:
                self.spans.emit_all(results, self.pipeline.span_of, self.pipeline.timeline)
            except Exception:  # emit_all counts its own failures; this is a bug in it: keep the agent up
                logger.exception("span export failed for a batch of results; skipped")
                self._health.skip("span_error")

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
                self.settle()
                ev = None
            if ev is not None:
                self.process(ev)
                for _ in range(min(queue.qsize(), 256)):  # a batch, then yield to the API and receivers
                    self.process(queue.get_nowait())
                self._health.success(self.state.clock())
            if time.monotonic() - last_flush >= JOURNAL_FLUSH_S:
                self.flush_journal()
                last_flush = time.monotonic()
            await asyncio.sleep(0)
        while not queue.empty():
            self.process(queue.get_nowait())
        self.settle()
        self.flush_journal()

    def flush_journal(self) -> None:
        if self.journal is None:
            return
        before = self.journal.written_total
        self.journal.flush()
        self.state.journal_written = self.journal.written_total
        self.state.journal_errors = self.journal.errors
        if self.journal.written_total < before:  # pragma: no cover - a journal bug
            logger.error("journal counter went backwards")

    # ---- serving -----------------------------------------------------------------------------------------
    def asgi_app(self, token: str | None) -> Any:
        # The API's GZipMiddleware compresses /metrics like every other route; prometheus_client's own gzip
        # beneath it would encode the body twice (Starlette >= 1.0 does not skip an encoded response).
        metrics = make_asgi_app(registry_for(self.state), disable_compression=True)
        return api_app(self.state, token=token, metrics_app=metrics)

    async def serve(self, opts: ServeOptions, stop: asyncio.Event,
                    started: Callable[[int], None] | None = None) -> None:
        """Serve the API until `stop`; `started(port)` once listening (port 0 picks a free one)."""
        config = uvicorn.Config(self.asgi_app(opts.token), host=opts.host, port=opts.port, log_level="warning",
                                lifespan="off", access_log=False)
        server = uvicorn.Server(config)
        task = asyncio.create_task(server.serve())
        while not server.started and not task.done():
            await asyncio.sleep(0.02)
        if task.done():
            await task  # raises what stopped it (e.g. the port is taken)
            raise OSError(f"API server stopped at start-up on {opts.host}:{opts.port}")
        port = server.servers[0].sockets[0].getsockname()[1] if server.servers else opts.port
        logger.info("API listening on http://%s:%d", opts.host, port)
        if started is not None:
            started(port)
        await stop.wait()
        server.should_exit = True
        with contextlib.suppress(asyncio.CancelledError):
            await task


async def replay_into(core: AgentCore, path: str | os.PathLike[str], *, speed: float | None = None,
                      progress: Callable[[int], None] | None = None) -> int:
    """Play a recording through the core exactly as live events would arrive (same pipeline, same sinks)."""
    source = ReplaySource(path)
    for stream, h in source.health.items():  # the live sources' names, so dashboards read a replay alike
        core.state.health[REPLAY_SOURCE_NAMES.get(stream, stream)] = h
    core.state.health["replay"] = SourceHealth("replay")
    core.state.replay_done = False
    n = 0

    def emit(ev: Event) -> None:
        nonlocal n
        core.process(ev)
        n += 1
        if progress is not None and n % 1000 == 0:
            progress(n)

    async def paced(ev: Event) -> None:
        emit(ev)
        if n % 256 == 0:
            await asyncio.sleep(0)  # let the API answer during a fast replay

    await source.play(paced if speed is None else emit, speed=speed)
    core.settle()
    core.flush_journal()
    core.state.health["replay"].success(core.state.clock())
    core.state.replay_done = True
    return n


def journal_for(directory: Path | None, max_bytes: int | None = None) -> ResultJournal | None:
    if directory is None:
        return None
    return ResultJournal(directory) if max_bytes is None else ResultJournal(directory, max_bytes=max_bytes)


def default_pipeline(config: PipelineConfig | None = None) -> AttributionPipeline:
    return AttributionPipeline(config)
