"""The GPU's own readings in the answer: NVML samples (from the fake NVML the sampler's tests drive, no GPU
needed) fed with a real recording reach the series, `/v1/timeline`, and the bandwidth part of decode slowdowns."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from prometheus_client.openmetrics.exposition import generate_latest
from prometheus_client.openmetrics.parser import text_string_to_metric_families
from sources.test_nvml_sampler import GIB, PEAK_BPS, make, tick
from starlette.testclient import TestClient

from attrib_agent.attribution.result import Cause, Evidence
from attrib_agent.events import Event, GpuSample
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.prometheus.collector import registry_for
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).resolve().parents[2] / "fixtures" / "recordings"


@cache
def events(name: str) -> tuple[Event, ...]:
    return tuple(ReplaySource(RECORDINGS / name).events())


def state_of(p: AttributionPipeline) -> AgentState:
    return AgentState(pipeline=p, health={"replay": SourceHealth("replay")})


def get(state: AgentState, path: str) -> dict:
    with TestClient(api_app(state)) as client:
        resp = client.get(path)
    assert resp.status_code == 200, resp.text
    return dict(resp.json())


def nvml_samples(t0: float, t1: float, busy: float) -> list[GpuSample]:
    """One reading a second over [t0, t1] from the sampler on a fake GPU whose DRAM runs at `busy` of its peak."""
    sampler, fake, clock = make()
    clock.now = t0 - 1.0
    assert sampler.start()
    out: list[GpuSample] = []
    while clock.now < t1:
        out += tick(sampler, fake, clock, dram_bps=busy * PEAK_BPS)
    sampler.close()
    return out


@cache
def with_gpu(busy: float) -> AttributionPipeline:
    evs: list[Event] = list(events("preempt"))
    evs += nvml_samples(min(e.ts for e in evs), max(e.ts for e in evs), busy)
    p = AttributionPipeline()
    p.feed_all(sorted(evs, key=lambda e: e.ts))
    p.settle()
    return p


def kv_bandwidth_seconds(p: AttributionPipeline) -> float:
    return sum(c.blame_by_cause(r.itl_gaps).get(Cause.KV_BANDWIDTH.value, 0.0) for r in p.store for c in r.culprits)


def test_measured_bandwidth_decides_the_bandwidth_part_and_says_so() -> None:
    busy, idle = with_gpu(0.9), with_gpu(0.05)
    for p in (busy, idle):
        named = [r for r in p.store if Cause.KV_BANDWIDTH.value in r.evidence]
        assert named and all(r.evidence[Cause.KV_BANDWIDTH.value] == Evidence.NVML_BANDWIDTH.value for r in named)
    # The same blame (Shapley amounts), labelled by what the GPU measured: an idle bus is not the mechanism.
    assert {(r.request_id, c.request_id, c.ttft_s, c.itl_s) for r in busy.store for c in r.culprits} == \
        {(r.request_id, c.request_id, c.ttft_s, c.itl_s) for r in idle.store for c in r.culprits}
    assert kv_bandwidth_seconds(idle) < 0.2 * kv_bandwidth_seconds(busy)
    # and the capacity waits stay kv_pressure whatever the bus did
    s003 = next(r for r in idle.store if r.request_id.endswith("-s003-0"))
    assert any(max(c.causes, key=c.causes.__getitem__) == Cause.KV_PRESSURE.value for c in s003.culprits)


def test_without_nvml_the_cost_model_is_the_bandwidth_evidence() -> None:
    p = AttributionPipeline()
    p.feed_all(events("preempt"))
    p.settle()
    named = [r for r in p.store if Cause.KV_BANDWIDTH.value in r.evidence]
    assert named and all(r.evidence[Cause.KV_BANDWIDTH.value] == Evidence.COST_MODEL.value for r in named)


def test_gpu_series_and_timeline_rows() -> None:
    state = state_of(with_gpu(0.9))
    text = generate_latest(registry_for(state)).decode()
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    (used,) = fams["attrib_gpu_memory_used_bytes"].samples
    (total,) = fams["attrib_gpu_memory_total_bytes"].samples
    (bw,) = fams["attrib_gpu_dram_bandwidth_ratio"].samples
    assert used.labels == total.labels == bw.labels == {"gpu": "0"}
    assert (used.value, total.value) == (70 * GIB, 80 * GIB) and abs(bw.value - 0.9) < 1e-6
    body = get(state, "/v1/timeline?max_steps=10000")
    assert body["gpu"] and {g["gpu"] for g in body["gpu"]} == {0}
    assert all(body["since"] - 2.0 <= g["ts"] <= body["until"] + 2.0 for g in body["gpu"])
    # GPM needs a pair of readings: the first falls back to NVML's memory utilisation (the fake's 37 %)
    ratios = [round(g["dram_bandwidth_ratio"], 6) for g in body["gpu"]]
    assert set(ratios) <= {0.37, 0.9} and ratios[1:] == [0.9] * (len(ratios) - 1)


def test_no_gpu_no_gpu_series_or_rows() -> None:
    p = AttributionPipeline()
    p.feed_all(events("whale1"))
    p.settle()
    state = state_of(p)
    text = generate_latest(registry_for(state)).decode()
    assert "attrib_gpu_memory_used_bytes{" not in text and "attrib_gpu_dram_bandwidth_ratio{" not in text
    assert get(state, "/v1/timeline")["gpu"] == []
