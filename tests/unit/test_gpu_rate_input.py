"""The GPU-rate input (issue 14 item 1): real continuous recordings time-compressed and joined into one vLLM that
is never idle. A few seconds of it here (the benchmark builds ten minutes): its rates as the agent's parsers read
them, no idle gap, no restart, ids unique per copy, and a format-v1 recording replay and lab playback read."""

from __future__ import annotations

from collections import Counter

import pytest

from attrib_agent.events import EngineStep, Event, RequestReceived, RequestSpan
from attrib_agent.lab.playback import read_streams
from attrib_agent.recording import FORMAT_VERSION, LOG, METRICS, OTLP, Recording
from attrib_agent.sources.replay import ReplaySource
from benchmarks._gpu_rate import (
    GPU_RATE_SOURCES,
    GpuRateInfo,
    GpuSource,
    TimeMap,
    build_gpu_rate,
    carry_counters,
    load_source,
    measure,
)
from benchmarks._recordings import FIXTURES

MAX_IDLE_S = 0.02
STAMP_S = 0.002  # log stamps are whole milliseconds: a gap read from them is off by up to a stamp either side


@pytest.fixture(scope="module")
def sources() -> list[GpuSource]:
    return [load_source(FIXTURES / n) for n in GPU_RATE_SOURCES]


@pytest.fixture(scope="module")
def built(sources: list[GpuSource], tmp_path_factory: pytest.TempPathFactory) -> GpuRateInfo:
    return build_gpu_rate(tmp_path_factory.mktemp("gpu"), duration_s=6.0, finished_per_s=55.0,
                          max_idle_s=MAX_IDLE_S, sources=sources)


@pytest.fixture(scope="module")
def events(built: GpuRateInfo) -> list[Event]:
    return list(ReplaySource(built.path).events())


def test_the_sources_are_continuous_bench_runs_slower_than_a_gpu(sources: list[GpuSource]) -> None:
    for s in sources:
        span = s.steps[-1][1] - s.steps[0][0]
        assert len(s.steps) / span < 100 and s.finished / span < 50  # what the compression has to make up


def test_rates_reach_a_gpu_servers_and_it_is_never_idle(built: GpuRateInfo) -> None:
    rates = measure(built.path)
    assert built.copies >= 3 and rates.span_s >= 5.0
    assert rates.steps_per_s >= 100
    assert rates.finished_per_s >= 50
    assert rates.max_idle_s <= MAX_IDLE_S + STAMP_S  # joins between copies included
    assert rates.restarts == 0  # counters carry on: one vLLM throughout
    assert rates.kv_max >= 0.9 and rates.kv_near_full_share > 0.05
    assert rates.whales >= 3


def test_one_vllm_iterations_rise_and_times_run_forward(built: GpuRateInfo, events: list[Event]) -> None:
    its = [e.iteration for e in events if isinstance(e, EngineStep)]
    assert all(b > a for a, b in zip(its, its[1:], strict=False))
    rec = Recording(built.path)
    assert rec.meta["version"] == FORMAT_VERSION and rec.meta["synthetic"]["builder"] == "gpu_rate"
    for stream in (METRICS, LOG, OTLP):
        stamps = [r["ts"] for r in rec.records(stream)]
        assert stamps and stamps == sorted(stamps), stream
        assert rec.stats[stream].skipped == 0
    replay = ReplaySource(built.path)
    assert sum(1 for _ in replay.events()) > 0
    assert sum(sum(h.skipped.values()) for h in replay.health.values()) == 0  # every line and body parsed


def test_ids_are_unique_per_copy_and_every_span_has_its_request(events: list[Event]) -> None:
    received = Counter(e.request_id for e in events if isinstance(e, RequestReceived))
    spans = Counter(e.request_id for e in events if isinstance(e, RequestSpan))
    assert received and max(received.values()) == 1 and max(spans.values()) == 1
    assert set(spans) <= set(received)
    assert len({e.trace_id for e in events if isinstance(e, RequestSpan)}) == len(spans)


def test_span_latencies_are_compressed_with_the_steps(events: list[Event]) -> None:
    spans = [e for e in events if isinstance(e, RequestSpan)]
    assert spans
    for s in spans:
        assert s.e2e_s is not None and 0 <= s.e2e_s <= 2.0  # seconds-long recorded requests, now short
        assert s.ttft_s is not None and s.ttft_s <= s.e2e_s + 1e-6


def test_lab_playback_reads_it(built: GpuRateInfo) -> None:
    streams = read_streams(built.path)
    assert all(streams.get(s) for s in (METRICS, LOG, OTLP))


def test_time_map_squeezes_idle_stretches_only() -> None:
    steps = [(10.0, 11.0), (11.5, 12.0), (20.0, 21.0)]  # idle 0.5 s, then 8 s
    f = TimeMap(steps, start=9.0, base=100.0, k=2.0, keep_s=1.0)
    assert f(9.0) == 100.0 and f(11.0) == pytest.approx(101.0)
    assert f(11.5) - f(11.0) == pytest.approx(0.25)  # under keep_s: only compressed
    assert f(20.0) - f(12.0) == pytest.approx(0.5)  # 8 s squeezed to keep_s, then / k
    assert f(21.0) - f(20.0) == pytest.approx(0.5)  # a step keeps its length / k
    xs = [9 + i * 0.01 for i in range(1300)]
    assert all(f(b) > f(a) for a, b in zip(xs, xs[1:], strict=False))


def test_counters_carry_on_gauges_do_not() -> None:
    body = ("# TYPE vllm:prompt_tokens counter\nvllm:prompt_tokens_total{engine=\"0\"} 10.0\n"
            "# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine=\"0\"} 3.0\n")
    out = carry_counters(body, {'vllm:prompt_tokens_total{engine="0"}': 100.0})
    assert 'vllm:prompt_tokens_total{engine="0"} 110.0' in out
    assert 'vllm:num_requests_running{engine="0"} 3.0' in out
