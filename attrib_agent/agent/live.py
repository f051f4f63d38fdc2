"""`attrib-agent run`: the live sources beside one vLLM server, wired into an AgentCore and served.

Each source only turns its input into typed events and enqueues them; none can stop the agent: I/O
trouble is counted in its health, and vLLM being down is marked as a gap (`state.vllm_gaps`,
`vllm_gap_since`) that the API and /metrics report until scrapes succeed again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine
from typing import Any

from attrib_agent.agent import budget_store
from attrib_agent.agent.budget_store import BudgetStore
from attrib_agent.agent.core import AgentCore, ServeOptions
from attrib_agent.config.load import AgentConfig
from attrib_agent.config.types import shown
from attrib_agent.sources import registry as source_registry
from attrib_agent.sources.log import source as log_source
from attrib_agent.sources.log.tailer import LogFollower
from attrib_agent.sources.metrics import source as metrics_source
from attrib_agent.sources.otlp import source as otlp_source
from attrib_agent.sources.source import Source, SourceContext

logger = logging.getLogger("attrib_agent")

GAP_CHECK_S = 0.25
STOP_WAIT_S = 10.0  # how long the tasks get to end after stop before they are cancelled
RESTART_SAME_GAP_SCRAPES = 20  # a restart seen within this many scrapes after an outage ended is its gap


class LiveAgent:
    """Owns the live sources and the core; `run(stop)` until stop is set."""

    def __init__(self, config: AgentConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.core = AgentCore.from_config(config, live=True, clock=clock)
        self.state = self.core.state
        self.sources: list[Source] = []
        self.api_port: int | None = None
        self._clock = clock

    @property
    def otlp_http_port(self) -> int | None:
        otlp = self._source(otlp_source.NAME)
        return otlp.http_port if isinstance(otlp, otlp_source.OtlpSource) else None

    @property
    def otlp_grpc_port(self) -> int | None:
        otlp = self._source(otlp_source.NAME)
        return otlp.grpc_port if isinstance(otlp, otlp_source.OtlpSource) else None

    def _source(self, name: str) -> Source | None:
        return next((s for s in self.sources if s.name == name), None)

    async def run(self, stop: asyncio.Event, started: Callable[[LiveAgent], None] | None = None) -> None:
        core = self.core
        restored = core.restore()
        if restored:
            logger.info("journal: serving %d earlier results again", restored)
        tasks: list[asyncio.Task[Any]] = []

        def spawn(coro: Coroutine[Any, Any, Any], name: str) -> asyncio.Task[Any]:
            tasks.append(asyncio.create_task(coro, name=name))
            return tasks[-1]

        try:
            await self._start(spawn, stop)
            if started is not None:
                started(self)
            await stop.wait()
        finally:  # also when a source or the API could not start: what did start stops, nothing is left serving
            stop.set()
            errors = await _ended(tasks, STOP_WAIT_S)
            for source in reversed(self.sources):
                await source.aclose()
            core.shutdown()
        if errors:
            raise errors[0]  # a task that failed while running, raised once everything is stopped

    async def _start(self, spawn: Callable[[Coroutine[Any, Any, Any], str], asyncio.Task[Any]],
                     stop: asyncio.Event) -> None:
        """Start the sources, the pipeline and the API; raises what kept one from starting (e.g. a port taken)."""
        cfg, core = self.config, self.core
        ctx = SourceContext(health=self.state.source, clock=self._clock, adopt_health=self.state.adopt)
        for spec in source_registry.SOURCES:
            source = spec.build(cfg, ctx)
            if source is None:
                continue
            self.sources.append(source)
            core.hear_spans((source,))  # before it runs: the log parser hears every span from its first line on
            await _started(source, spawn(source.run(core.submit, stop), source.name))
        self._keep_budget()
        spawn(self._watch_gaps(stop), "gaps")
        spawn(core.consume(stop), "pipeline")
        api_ready = asyncio.Event()

        def on_api(port: int) -> None:
            self.api_port = port
            api_ready.set()

        host, port = cfg.listen_host, cfg.listen_port
        api = spawn(core.serve(ServeOptions(host, port, cfg.reveal_api_token()), stop, on_api), "api")
        if not await up_or_ended(api_ready, api):
            await api  # raises what stopped it

    def _keep_budget(self) -> None:
        """vLLM's budget kept in state_dir for a later agent whose log no longer holds the line (budget_store.py)."""
        log = self._source(log_source.NAME)
        if self.config.state_dir is None or not isinstance(log, log_source.LogSource) or not isinstance(
                log.follower, LogFollower):
            return
        follower = log.follower
        self.core.add_sink(BudgetStore(self.config.state_dir, self.core.pipeline, lambda: follower.startup_seen,
                                       self.state.source(budget_store.NAME)))

    async def _watch_gaps(self, stop: asyncio.Event) -> None:
        """vLLM unreachable (scrapes failing) or restarted (counters reset) opens a gap; a success closes it."""
        state = self.state
        health = state.source(metrics_source.NAME)
        restarts = state.pipeline.vllm_restarts
        closed_at_ok: int | None = None  # the poller's success count when the last gap closed
        while not stop.is_set():
            up = health.up and health.ok_total > 0
            if not up and health.errors and state.vllm_gap_since is None:
                state.vllm_gaps += 1
                state.vllm_gap_since = health.last_error_ts or self._clock()
                logger.warning("vLLM unreachable at %s: %s", shown(self.config.metrics_url), health.last_error)
            elif up and state.vllm_gap_since is not None:
                logger.info("vLLM reachable again after %.1f s", max(0.0, self._clock() - state.vllm_gap_since))
                state.vllm_gap_since = None
                closed_at_ok = health.ok_total
            if state.pipeline.vllm_restarts > restarts:
                restarts = state.pipeline.vllm_restarts
                # A restart seen on the first scrapes after an outage is that outage's gap; one between two
                # successful scrapes (a quick restart, a long poll interval) is a gap of its own.
                same_gap = state.vllm_gap_since is not None or (
                    closed_at_ok is not None and health.ok_total - closed_at_ok <= RESTART_SAME_GAP_SCRAPES)
                if not same_gap:
                    state.vllm_gaps += 1
                closed_at_ok = None
                logger.warning("vLLM restarted (its counters reset)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), GAP_CHECK_S)


async def _started(source: Source, task: asyncio.Task[Any]) -> None:
    """Wait until the source is up; a source that could not start (a port taken) raises its error here."""
    if not await up_or_ended(source.started, task):
        await task  # raises what stopped it
        raise OSError(f"source {source.name} ended before it started")


async def _ended(tasks: list[asyncio.Task[Any]], wait_s: float) -> list[BaseException]:
    """Wait up to `wait_s` for the tasks to end after stop and cancel those that did not; what they raised."""
    if not tasks:
        return []
    _, pending = await asyncio.wait(tasks, timeout=wait_s)
    for t in pending:
        t.cancel()
    if pending:
        await asyncio.wait(pending)
    return [e for t in tasks if not t.cancelled() and (e := t.exception()) is not None]


async def up_or_ended(up: asyncio.Event, task: asyncio.Task[Any]) -> bool:
    """Wait until `up` is set or `task` ends first (it could not start: a source, the API); whether it is up."""
    waiter = asyncio.create_task(up.wait())
    await asyncio.wait([waiter, task], return_when=asyncio.FIRST_COMPLETED)
    if not up.is_set():
        waiter.cancel()
    return up.is_set()
