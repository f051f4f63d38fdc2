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
from typing import Any, cast

import uvicorn

from attrib_agent.app import AgentCore, ServeOptions, journal_for
from attrib_agent.config import AgentConfig
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.otel_spans import SlowdownSpans, tracer_provider_for
from attrib_agent.sources.log_parser import LogLineParser
from attrib_agent.sources.log_tailer import BinaryReader, LogFollower, StdinLines
from attrib_agent.sources.metrics_poller import MetricsPoller
from attrib_agent.sources.nvml_sampler import NvmlSampler
from attrib_agent.sources.otlp_decode import DecodeResult
from attrib_agent.sources.otlp_forward import OtlpForwarder
from attrib_agent.sources.otlp_grpc import OtlpGrpcReceiver
from attrib_agent.sources.otlp_http import otlp_http_app

logger = logging.getLogger("attrib_agent")

GAP_CHECK_S = 0.25
RESTART_SAME_GAP_SCRAPES = 20  # a restart seen within this many scrapes after an outage ended is its gap


class LiveAgent:
    """Owns the live sources and the core; `run(stop)` until stop is set."""

    def __init__(self, config: AgentConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        spans = None
        if config.otlp_export is not None:
            target = config.otlp_export
            spans = SlowdownSpans(tracer_provider_for(target.endpoint, protocol=target.protocol))
        self.core = AgentCore(AttributionPipeline(config.pipeline_config()),
                              journal=journal_for(config.journal_dir, config.journal_max_bytes), spans=spans,
                              clock=clock)
        self.state = self.core.state
        self.state.forecast = config.forecast_settings()
        self.api_port: int | None = None
        self.otlp_http_port: int | None = None
        self.otlp_grpc_port: int | None = None
        self._clock = clock

    async def run(self, stop: asyncio.Event, started: Callable[[LiveAgent], None] | None = None) -> None:
        cfg, core, state = self.config, self.core, self.state
        restored = core.restore()
        if restored:
            logger.info("journal: serving %d earlier results again", restored)
        tasks: list[asyncio.Task[Any]] = []

        def spawn(coro: Coroutine[Any, Any, Any], name: str) -> None:
            tasks.append(asyncio.create_task(coro, name=name))

        forwarder = None
        if cfg.otlp_forward is not None:
            forwarder = OtlpForwarder(cfg.otlp_forward.endpoint, protocol=cfg.otlp_forward.protocol,
                                      health=state.source("otlp_forward"), clock=self._clock)
            await forwarder.start()

        def spans_in(result: DecodeResult) -> None:
            core.submit_many(result.spans)

        poller = MetricsPoller(cfg.metrics_url or "", interval_s=cfg.metrics_interval_s,
                               timeout_s=cfg.metrics_timeout_s, health=state.source("vllm_metrics"), clock=self._clock)
        spawn(poller.run(core.submit, stop), "metrics")
        spawn(self._watch_gaps(poller, stop), "gaps")
        follower: LogFollower | StdinLines | None = None
        if cfg.log_file:
            follower = LogFollower(cfg.log_file, from_start=cfg.log_from_start, clock=self._clock,
                                   poll_interval_s=cfg.log_poll_interval_s, health=state.source("vllm_log"))
        elif cfg.log_stdin:
            import sys
            follower = StdinLines(cast(BinaryReader, sys.stdin.buffer), clock=self._clock,
                                  health=state.source("vllm_log"))
        if follower is not None:
            spawn(self._follow(follower), "log")
        grpc_rx = None
        if cfg.otlp_grpc_port:
            grpc_rx = OtlpGrpcReceiver(spans_in, host=cfg.otlp_bind, port=cfg.otlp_grpc_port,
                                       health=state.source("otlp"), forwarder=forwarder, clock=self._clock,
                                       max_message_bytes=cfg.otlp_max_body_bytes)
            await grpc_rx.start()
            self.otlp_grpc_port = grpc_rx.port
        http_server = None
        if cfg.otlp_http_port:
            app = otlp_http_app(spans_in, health=state.source("otlp"), forwarder=forwarder, clock=self._clock,
                                max_body=cfg.otlp_max_body_bytes)
            http_server = uvicorn.Server(uvicorn.Config(app, host=cfg.otlp_bind, port=cfg.otlp_http_port,
                                                        log_level="warning", lifespan="off", access_log=False))
            spawn(http_server.serve(), "otlp_http")
            while not http_server.started:
                if tasks[-1].done():
                    await tasks[-1]
                    raise OSError(f"OTLP/HTTP receiver could not bind {cfg.otlp_bind}:{cfg.otlp_http_port}")
                await asyncio.sleep(0.02)
            self.otlp_http_port = http_server.servers[0].sockets[0].getsockname()[1]
        nvml = None
        if cfg.nvml:
            nvml = NvmlSampler(interval_s=cfg.nvml_interval_s, clock=self._clock)
            state.health["nvml"] = nvml.health
            if nvml.start():
                spawn(nvml.run(core.submit, stop), "nvml")
            else:
                logger.warning("NVML unavailable (%s); GPU samples off", nvml.unavailable_reason)
        spawn(core.consume(stop), "pipeline")
        api_ready = asyncio.Event()

        def on_api(port: int) -> None:
            self.api_port = port
            api_ready.set()

        host, port = cfg.listen_host, cfg.listen_port
        spawn(core.serve(ServeOptions(host, port, cfg.reveal_api_token()), stop, on_api), "api")
        waiter = asyncio.create_task(api_ready.wait())
        await asyncio.wait([waiter, tasks[-1]], return_when=asyncio.FIRST_COMPLETED)
        if tasks[-1].done() and not api_ready.is_set():
            waiter.cancel()
            stop.set()
            await tasks[-1]
        if started is not None:
            started(self)
        await stop.wait()
        if follower is not None:
            follower.close()
        if http_server is not None:
            http_server.should_exit = True
        for t in tasks:
            with contextlib.suppress(asyncio.CancelledError, TimeoutError):
                await asyncio.wait_for(t, 10)
        if grpc_rx is not None:
            await grpc_rx.stop()
        if forwarder is not None:
            await forwarder.stop()
        if nvml is not None:
            nvml.close()
        await poller.aclose()
        if core.spans is not None:
            core.spans.force_flush(5_000)
            core.spans.tracer_provider.shutdown()
        if core.journal is not None:
            core.journal.close()

    async def _follow(self, follower: LogFollower | StdinLines) -> None:
        parser = LogLineParser(follower.health)
        async for ts, line in follower.lines():
            self.core.submit_many(parser.parse_all(line, ts))

    async def _watch_gaps(self, poller: MetricsPoller, stop: asyncio.Event) -> None:
        """vLLM unreachable (scrapes failing) or restarted (counters reset) opens a gap; a success closes it."""
        state = self.state
        restarts = state.pipeline.vllm_restarts
        closed_at_ok: int | None = None  # the poller's success count when the last gap closed
        while not stop.is_set():
            up = poller.health.up and poller.health.ok_total > 0
            if not up and poller.health.errors and state.vllm_gap_since is None:
                state.vllm_gaps += 1
                state.vllm_gap_since = poller.health.last_error_ts or self._clock()
                logger.warning("vLLM unreachable at %s: %s", poller.url, poller.health.last_error)
            elif up and state.vllm_gap_since is not None:
                logger.info("vLLM reachable again after %.1f s", max(0.0, self._clock() - state.vllm_gap_since))
                state.vllm_gap_since = None
                closed_at_ok = poller.health.ok_total
            if state.pipeline.vllm_restarts > restarts:
                restarts = state.pipeline.vllm_restarts
                # A restart seen on the first scrapes after an outage is that outage's gap; one between two
                # successful scrapes (a quick restart, a long poll interval) is a gap of its own.
                same_gap = state.vllm_gap_since is not None or (
                    closed_at_ok is not None and poller.health.ok_total - closed_at_ok <= RESTART_SAME_GAP_SCRAPES)
                if not same_gap:
                    state.vllm_gaps += 1
                closed_at_ok = None
                logger.warning("vLLM restarted (its counters reset)")
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), GAP_CHECK_S)
