"""Polls vLLM's /metrics on a fixed cadence and turns each body into `MetricsSnapshot`s.

I/O only: parsing is `parser.py`'s. Every failure (time-out, refused, HTTP error, bad body) is
counted in `health` by kind and yields no snapshot; nothing bad input can do raises into the pipeline.
"""

from __future__ import annotations

import asyncio
import logging
import math
import time
from collections.abc import Awaitable, Callable
from typing import Final

import httpx

from attrib_agent.events import MetricsSnapshot
from attrib_agent.health import SourceHealth
from attrib_agent.sources.metrics.http_get import (
    BadResponse,
    BodyTooLarge,
    ConnectFailed,
    KeepAliveGet,
    Undecodable,
    plain_http,
)
from attrib_agent.sources.metrics.parser import CounterTracker, MetricsParseError, parse_metrics
from attrib_agent.sources.metrics.settings import DEFAULT_INTERVAL_S, DEFAULT_TIMEOUT_S, MIN_INTERVAL_S

logger = logging.getLogger(__name__)

MAX_BODY_BYTES: Final = 16 * 1024 * 1024
"""A vLLM 0.32 body is ~50 KB per engine; a larger one is not a /metrics page we should hold in memory."""
MAX_LOGGED_TYPES: Final = 32  # distinct unexpected exception types logged with a traceback


def observe_body(text: str, ts: float, health: SourceHealth, tracker: CounterTracker) -> list[MetricsSnapshot]:
    """One /metrics body received at `ts`: its snapshots (counter resets flagged), counted in `health`. Live and
    replay both read bodies through here. Raises MetricsParseError for a body that is not Prometheus text."""
    snapshots = parse_metrics(text, ts)
    health.success(ts)
    if not snapshots:
        health.skip("no_vllm_series")  # e.g. vLLM started with --disable-log-stats
    return tracker.observe(snapshots)


class MetricsPoller:
    """Scrapes one vLLM server; its dependencies (HTTP client, clocks, sleep) are injected, so tests fake them.

    `clock` stamps receipt times (unix seconds); `monotonic` and `sleep` drive the cadence. A client
    passed in stays the caller's to close. Without one, an `http://` URL is fetched over one kept-alive
    connection by `http_get.KeepAliveGet` (httpx's machinery was most of the poller's CPU at 4 Hz), any other
    by an httpx client made here; `aclose()` closes either.
    """

    def __init__(
        self,
        url: str,
        *,
        interval_s: float = DEFAULT_INTERVAL_S,
        timeout_s: float = DEFAULT_TIMEOUT_S,
        client: httpx.AsyncClient | None = None,
        clock: Callable[[], float] = time.time,
        on_raw: Callable[[float, str], None] | None = None,
        monotonic: Callable[[], float] = time.monotonic,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        max_body_bytes: int = MAX_BODY_BYTES,
        health: SourceHealth | None = None,
        tracker: CounterTracker | None = None,
        name: str = "vllm_metrics",
    ) -> None:
        if not interval_s >= MIN_INTERVAL_S or math.isinf(interval_s):
            raise ValueError(f"interval_s must be a finite number >= {MIN_INTERVAL_S} s, got {interval_s!r}")
        if not timeout_s > 0 or math.isinf(timeout_s):
            raise ValueError(f"timeout_s must be a finite number > 0, got {timeout_s!r}")
        if max_body_bytes < 1:
            raise ValueError("max_body_bytes must be >= 1")
        parsed = httpx.URL(url)  # a bad URL is a configuration error: say so now, not at every poll
        self.name = name  # the agent's source shape: name, started, run(emit, stop), aclose()
        self.started = asyncio.Event()
        self.url = url
        self._url_for_logs = str(parsed.copy_with(username=None, password=None))
        self.interval_s = interval_s
        self.timeout_s = timeout_s
        self.max_body_bytes = max_body_bytes
        self.health = health if health is not None else SourceHealth("metrics")
        self.tracker = tracker if tracker is not None else CounterTracker()
        self._own_client = client is None
        self._plain = KeepAliveGet(url) if client is None and plain_http(url) else None
        self._client = client if client is not None or self._plain is not None else httpx.AsyncClient(trust_env=False)
        self._clock = clock
        self._on_raw = on_raw
        self._monotonic = monotonic
        self._sleep = sleep
        self._fetching = asyncio.Lock()  # poll_once callers never overlap their fetches
        self._seen_unexpected: set[str] = set()

    async def aclose(self) -> None:
        if self._plain is not None:
            self._plain.close()
        if self._own_client and self._client is not None:
            await self._client.aclose()

    async def __aenter__(self) -> MetricsPoller:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def _fetch(self) -> tuple[int, bytes]:
        if self._plain is not None:
            return await self._plain.get(self.timeout_s, self.max_body_bytes)
        assert self._client is not None
        async with self._client.stream("GET", self.url, timeout=self.timeout_s) as resp:
            if not 200 <= resp.status_code < 300:
                return resp.status_code, b""
            body = bytearray()
            async for chunk in resp.aiter_bytes():
                body += chunk
                if len(body) > self.max_body_bytes:
                    raise BodyTooLarge
            return resp.status_code, bytes(body)

    async def poll_once(self) -> list[MetricsSnapshot]:
        """One scrape: its snapshots (counter resets flagged), or [] with the failure counted in `health`."""
        async with self._fetching:
            try:
                status, body = await self._fetch()
            except (httpx.TimeoutException, TimeoutError) as e:
                return self._failed("timeout", type(e).__name__)
            except (httpx.ConnectError, ConnectFailed) as e:
                return self._failed("refused", type(e).__name__)
            except (httpx.DecodingError, Undecodable):
                return self._failed("malformed", "undecodable content-encoding")
            except BodyTooLarge:
                return self._failed("malformed", f"body over {self.max_body_bytes} bytes")
            except (httpx.HTTPError, BadResponse) as e:
                return self._failed("transport", type(e).__name__)
            except Exception as e:  # the source boundary: an unexpected failure must not stop the agent
                self._log_unexpected(e, "metrics poll of %s failed unexpectedly", self._url_for_logs)
                return self._failed("transport", type(e).__name__)
            if not 200 <= status < 300:
                return self._failed(f"http_{status // 100}xx", f"status {status}")
            ts = self._clock()
            text = body.decode("utf-8", errors="replace")  # the exposition format is UTF-8
            if self._on_raw is not None:
                try:
                    self._on_raw(ts, text)
                except Exception as e:
                    self._log_unexpected(e, "on_raw callback failed; scrape at %.3f not journaled", ts)
                    self.health.skip("on_raw_failed")
            was_up = self.health.up
            try:
                snapshots = observe_body(text, ts, self.health, self.tracker)
            except MetricsParseError as e:
                return self._failed("malformed", str(e), ts)
            if not was_up:
                logger.info("vLLM /metrics at %s answering again", self._url_for_logs)
            return snapshots

    def _failed(self, kind: str, message: str, ts: float | None = None) -> list[MetricsSnapshot]:
        # Warn when the source goes down, not at every poll of an outage (that is what `health` counts).
        log = logger.warning if self.health.up else logger.debug
        log("vLLM /metrics at %s failing: %s (%s)", self._url_for_logs, kind, message)
        self.health.error(kind, self._clock() if ts is None else ts, message)
        return []

    def _log_unexpected(self, e: Exception, msg: str, *args: object) -> None:
        """A traceback the first time an exception type shows up; later ones only at debug level."""
        name = type(e).__name__
        if name not in self._seen_unexpected and len(self._seen_unexpected) < MAX_LOGGED_TYPES:
            self._seen_unexpected.add(name)
            logger.exception(msg, *args)
        else:
            logger.debug(msg + ": %s", *args, name)

    async def run(self, emit: Callable[[MetricsSnapshot], None], stop: asyncio.Event) -> None:
        """Poll every `interval_s` until `stop` is set; ticks are fixed, so the cadence never drifts.

        Fetches run one at a time: a scrape that overruns skips the ticks it covered (counted as
        `missed_tick`) instead of firing late ones back to back.
        """
        start = self._monotonic()
        tick = 0
        self.started.set()
        while not stop.is_set():
            for snapshot in await self.poll_once():
                try:
                    emit(snapshot)
                except Exception as e:
                    self._log_unexpected(e, "metrics emit failed; snapshot of engine %s dropped", snapshot.engine)
                    self.health.skip("emit_failed")
            tick += 1
            now = self._monotonic()
            due = start + tick * self.interval_s
            if now > due:
                missed = int((now - due) // self.interval_s) + 1
                self.health.skip("missed_tick", missed)
                tick += missed
                due = start + tick * self.interval_s
            await self._wait(due - now, stop)

    async def _wait(self, delay: float, stop: asyncio.Event) -> None:
        sleeper = asyncio.ensure_future(self._sleep(delay))
        stopper = asyncio.ensure_future(stop.wait())
        try:
            await asyncio.wait((sleeper, stopper), return_when=asyncio.FIRST_COMPLETED)
        finally:
            for task in (sleeper, stopper):
                task.cancel()
            await asyncio.gather(sleeper, stopper, return_exceptions=True)
