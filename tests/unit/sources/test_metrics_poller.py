"""MetricsPoller through httpx.MockTransport serving the real recorded bodies, and real httpx failures.

No patching: the transport, the clocks and sleep are injected. Cadence tests run on a fake monotonic
clock that the fake transport advances by each fetch's duration, so they are exact and never flaky.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Coroutine, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attrib_agent.events import MetricsSnapshot
from attrib_agent.recording import METRICS, Recording
from attrib_agent.sources.metrics.parser import parse_metrics
from attrib_agent.sources.metrics.poller import MetricsPoller

RECORDING = Path(__file__).parents[2] / "fixtures" / "recordings" / "preempt"
BODIES = tuple(r["text"] for r in Recording(RECORDING).records(METRICS))
URL = "http://vllm.test:8000/metrics"
EPOCH = 1_795_308_000.0

Reply = tuple[int, bytes, str | None]  # status, body, content-encoding
Handler = Callable[[httpx.Request], Coroutine[Any, Any, httpx.Response]]


class FakeTime:
    """Monotonic and wall clocks that move only when a fetch takes time or the poller sleeps."""

    def __init__(self) -> None:
        self.now = 0.0

    def monotonic(self) -> float:
        return self.now

    def wall(self) -> float:
        return EPOCH + self.now

    async def sleep(self, delay: float) -> None:
        self.now += max(0.0, delay)
        await asyncio.sleep(0)


def serve(bodies: Iterator[str | int | Exception]) -> Handler:
    """A handler answering each request with the next body (200), status code (empty body) or exception."""

    async def handler(request: httpx.Request) -> httpx.Response:
        item = next(bodies)
        if isinstance(item, Exception):
            raise item
        if isinstance(item, int):
            return httpx.Response(item)
        return httpx.Response(200, text=item, headers={"content-type": "text/plain; version=0.0.4; charset=utf-8"})

    return handler


def make_poller(handler: Handler, ft: FakeTime | None = None, **kw: object) -> MetricsPoller:
    ft = ft or FakeTime()
    client = httpx.AsyncClient(transport=httpx.MockTransport(handler))
    return MetricsPoller(URL, client=client, clock=ft.wall, monotonic=ft.monotonic, sleep=ft.sleep, **kw)  # type: ignore[arg-type]


def test_polls_real_bodies_into_snapshots_and_journals_them_raw() -> None:
    raw: list[tuple[float, str]] = []
    poller = make_poller(serve(iter(BODIES)), on_raw=lambda ts, text: raw.append((ts, text)))

    async def go() -> list[list[MetricsSnapshot]]:
        return [await poller.poll_once() for _ in BODIES]

    got = asyncio.run(go())
    assert got == [parse_metrics(text, EPOCH) for text in BODIES]  # and none flagged as a reset
    assert raw == [(EPOCH, text) for text in BODIES]
    assert poller.health.ok_total == len(BODIES) and not poller.health.errors and poller.health.up


def _request() -> httpx.Request:
    return httpx.Request("GET", URL)


@pytest.mark.parametrize(("failure", "kind"), [
    (httpx.ConnectError("[Errno 111] Connection refused", request=_request()), "refused"),
    (httpx.ConnectTimeout("timed out", request=_request()), "timeout"),
    (httpx.ReadTimeout("timed out", request=_request()), "timeout"),
    (httpx.ReadError("connection reset", request=_request()), "transport"),
    (httpx.RemoteProtocolError("peer closed connection", request=_request()), "transport"),
    (503, "http_5xx"),
    (500, "http_5xx"),
    (404, "http_4xx"),
    (302, "http_3xx"),
    ("<html><body>Bad Gateway</body></html>", "malformed"),
    (BODIES[-1].replace('vllm:kv_cache_usage_perc{engine="0"', 'vllm:kv_cache_usage_perc{engine="0"{'), "malformed"),
])
def test_failures_are_counted_by_kind_never_raised(failure: str | int | Exception, kind: str) -> None:
    poller = make_poller(serve(iter([failure, BODIES[-1]])))

    async def go() -> tuple[list[MetricsSnapshot], bool, list[MetricsSnapshot]]:
        first = await poller.poll_once()
        up = poller.health.up
        return first, up, await poller.poll_once()

    first, up_after_failure, second = asyncio.run(go())
    assert first == [] and not up_after_failure
    assert dict(poller.health.errors) == {kind: 1} and poller.health.last_error is not None
    assert "tiny" not in poller.health.last_error and "html" not in poller.health.last_error
    assert second == parse_metrics(BODIES[-1], EPOCH) and poller.health.up  # and it carries on


def test_undecodable_and_oversized_bodies_are_malformed() -> None:
    async def gzip_lie(request: httpx.Request) -> httpx.Response:
        return httpx.Response(200, content=BODIES[-1].encode(), headers={"content-encoding": "gzip"})

    poller = make_poller(gzip_lie)
    assert asyncio.run(poller.poll_once()) == []
    small = make_poller(serve(iter([BODIES[-1]])), max_body_bytes=len(BODIES[-1]) // 2)
    assert asyncio.run(small.poll_once()) == []
    assert poller.health.errors["malformed"] == small.health.errors["malformed"] == 1


def test_valid_body_without_vllm_series_is_a_success_with_nothing_to_emit() -> None:
    body = "\n".join(ln for ln in BODIES[-1].splitlines() if "vllm:" not in ln) + "\n"  # --disable-log-stats
    poller = make_poller(serve(iter([body])))
    assert asyncio.run(poller.poll_once()) == []
    assert poller.health.ok_total == 1 and poller.health.skipped["no_vllm_series"] == 1


def test_restart_flags_counter_reset() -> None:
    poller = make_poller(serve(iter([BODIES[-1], BODIES[0]])))

    async def go() -> list[MetricsSnapshot]:
        return [s for _ in range(2) for s in await poller.poll_once()]

    before, after = asyncio.run(go())
    assert not before.counter_reset and after.counter_reset


@pytest.mark.parametrize("interval", [0.049, 0.0, -1.0, float("nan"), float("inf")])
def test_interval_below_50ms_is_refused(interval: float) -> None:
    with pytest.raises(ValueError):
        MetricsPoller(URL, interval_s=interval)


def test_interval_of_50ms_is_allowed_and_own_client_is_closed() -> None:
    poller = MetricsPoller(URL.replace("http:", "https:"), interval_s=0.05)  # https: an httpx client of its own
    asyncio.run(poller.aclose())
    assert poller._client is not None and poller._client.is_closed
    plain = MetricsPoller(URL, interval_s=0.05)  # http: the plain keep-alive GET (test_metrics_http_get.py)
    assert plain._client is None and plain._plain is not None
    asyncio.run(plain.aclose())


def test_callers_client_is_left_open() -> None:
    client = httpx.AsyncClient(transport=httpx.MockTransport(serve(iter([]))))
    asyncio.run(MetricsPoller(URL, client=client).aclose())
    assert not client.is_closed


def _timed_handler(ft: FakeTime, durations: list[float], starts: list[float], stop: asyncio.Event) -> Handler:
    in_flight = [0]

    async def handler(request: httpx.Request) -> httpx.Response:
        starts.append(ft.now)
        in_flight[0] += 1
        assert in_flight[0] == 1, "overlapping fetches"
        await asyncio.sleep(0)
        ft.now += durations[len(starts) - 1]
        in_flight[0] -= 1
        if len(starts) == len(durations):
            stop.set()
        return httpx.Response(200, text=BODIES[len(starts) - 1])

    return handler


def test_run_keeps_a_fixed_cadence_without_drift() -> None:
    ft, starts, emitted = FakeTime(), list[float](), list[MetricsSnapshot]()
    durations = [0.013, 0.030, 0.021, 0.011, 0.0297, 0.012] * 5  # real fetch_s values seen in the recordings

    async def go() -> None:
        stop = asyncio.Event()
        poller = make_poller(_timed_handler(ft, durations, starts, stop), ft)
        await poller.run(emitted.append, stop)

    asyncio.run(go())
    assert starts == pytest.approx([k * 0.25 for k in range(len(durations))], abs=1e-9)
    assert [s.ts for s in emitted] == pytest.approx([EPOCH + k * 0.25 + d for k, d in enumerate(durations)])


def test_run_skips_ticks_a_slow_fetch_overran_instead_of_overlapping() -> None:
    ft, starts = FakeTime(), list[float]()
    durations = [0.01, 0.6, 0.01, 0.01]

    async def go() -> MetricsPoller:
        stop = asyncio.Event()
        poller = make_poller(_timed_handler(ft, durations, starts, stop), ft)
        await poller.run(lambda s: None, stop)
        return poller

    poller = asyncio.run(go())
    assert starts == pytest.approx([0.0, 0.25, 1.0, 1.25])  # 0.5 and 0.75 fell inside the slow fetch
    assert poller.health.skipped["missed_tick"] == 2


def test_run_survives_failing_callbacks() -> None:
    def boom(*args: object) -> None:
        raise RuntimeError("callback bug")

    ft, starts = FakeTime(), list[float]()

    async def go() -> MetricsPoller:
        stop = asyncio.Event()
        poller = make_poller(_timed_handler(ft, [0.01] * 3, starts, stop), ft, on_raw=boom)
        await poller.run(boom, stop)
        return poller

    poller = asyncio.run(go())
    assert poller.health.ok_total == 3
    assert poller.health.skipped["emit_failed"] == poller.health.skipped["on_raw_failed"] == 3


def test_unexpected_failures_log_one_traceback_per_type(caplog: pytest.LogCaptureFixture) -> None:
    poller = make_poller(serve(iter([RuntimeError("bug"), RuntimeError("bug"), OSError("x"), BODIES[-1]])))

    async def go() -> None:
        for _ in range(4):
            await poller.poll_once()

    with caplog.at_level(logging.DEBUG, logger="attrib_agent.sources.metrics.poller"):
        asyncio.run(go())
    tracebacks = [r for r in caplog.records if r.exc_info]
    assert [r.exc_info[1].__class__ for r in tracebacks if r.exc_info] == [RuntimeError, OSError]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1  # going down is warned once, not at every failed poll
    assert any("answering again" in r.getMessage() for r in caplog.records)
    assert poller.health.errors["transport"] == 3 and poller.health.up


def test_run_with_real_clocks_stops_promptly() -> None:
    async def go() -> tuple[int, float]:
        client = httpx.AsyncClient(transport=httpx.MockTransport(serve(iter(BODIES * 100))))
        poller = MetricsPoller(URL, interval_s=10.0, client=client)
        stop = asyncio.Event()
        emitted: list[MetricsSnapshot] = []
        task = asyncio.create_task(poller.run(emitted.append, stop))
        while not emitted:
            await asyncio.sleep(0.005)
        t0 = time.monotonic()
        stop.set()
        await asyncio.wait_for(task, 5.0)
        return len(emitted), time.monotonic() - t0

    n, stop_latency = asyncio.run(go())
    assert n == 1 and stop_latency < 1.0  # it was sleeping a 10 s interval, not finishing it


# --- the poller never raises, whatever the server does ------------------------------------------------

FAILURES = [httpx.ConnectError, httpx.ConnectTimeout, httpx.ReadTimeout, httpx.WriteTimeout, httpx.PoolTimeout,
            httpx.ReadError, httpx.WriteError, httpx.CloseError, httpx.RemoteProtocolError,
            httpx.LocalProtocolError, httpx.ProxyError, httpx.UnsupportedProtocol]
RESPONSES = st.one_of(
    st.sampled_from(FAILURES).map(lambda cls: cls("failure", request=_request())),
    st.sampled_from([OSError, RuntimeError]).map(lambda cls: cls("unexpected")),  # fresh: a raise grows its traceback
    st.tuples(
        st.integers(100, 599) | st.just(200),
        st.one_of(st.binary(max_size=300), st.sampled_from(BODIES).map(str.encode),
                  st.tuples(st.sampled_from(BODIES), st.integers(0, 60_000), st.binary(max_size=8))
                  .map(lambda t: t[0].encode()[:t[1]] + t[2] + t[0].encode()[t[1]:])),
        st.sampled_from([None, "gzip", "deflate", "br", "identity", "zstd", "x-unknown"]),
    ),
)


@pytest.fixture(scope="module")
def runner() -> Iterator[asyncio.Runner]:
    """One event loop for every example; the poller's own logging is off (the log-once test covers it)."""
    log = logging.getLogger("attrib_agent.sources.metrics.poller")
    level, log.disabled = log.level, True
    with asyncio.Runner() as r:
        yield r
    log.disabled = False
    log.setLevel(level)


# Each except clause of the poller and its parser narrowed in turn (an injected bug): those this property
# catches, it catches in the first ~20 examples; 10,000 examples took ~70 s for nothing more.
PROPERTY_EXAMPLES = 1_000


@settings(max_examples=PROPERTY_EXAMPLES, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(RESPONSES, min_size=1, max_size=3))
def test_poller_never_raises(runner: asyncio.Runner, responses: list[Exception | Reply]) -> None:
    async def handler(request: httpx.Request) -> httpx.Response:
        item = queue.pop(0)
        if isinstance(item, Exception):
            raise item
        status, body, encoding = item
        return httpx.Response(status, content=body, headers={"content-encoding": encoding} if encoding else {})

    queue = list(responses)
    poller = make_poller(handler)

    async def go() -> None:
        for _ in responses:
            snaps = await poller.poll_once()
            assert all(isinstance(s, MetricsSnapshot) for s in snaps)
        await poller._client.aclose()

    runner.run(go())
    assert poller.health.ok_total + sum(poller.health.errors.values()) == len(responses)
