"""docs/metrics.md is the contract for /metrics: after replaying a real recording, what the collector serves and
the catalog's rows agree both ways (names, types, units, label names, help), in both exposition formats."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from prometheus_client import generate_latest, make_asgi_app
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics
from prometheus_client.parser import text_string_to_metric_families as parse_text
from prometheus_client.registry import CollectorRegistry

from attrib_agent.events import GpuSample
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.collector import SECTIONS, AgentCollector, registry_for
from attrib_agent.sources.replay import ReplaySource

ROOT = Path(__file__).resolve().parents[3]
CATALOG = ROOT / "docs" / "metrics.md"
RECORDINGS = ROOT / "tests" / "fixtures" / "recordings"
# ReplaySource keeps health per recorded stream; the live agent names its sources as below
STREAM_SOURCE = {"metrics": "vllm_metrics", "log": "vllm_log", "otlp": "otlp", "nvml": "nvml"}


@dataclass(frozen=True)
class Row:
    name: str
    type: str
    unit: str
    labels: frozenset[str]
    help: str


def catalog_rows() -> dict[str, Row]:
    rows: dict[str, Row] = {}
    for line in CATALOG.read_text().splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) != 5 or not cells[0].startswith("attrib_"):
            continue
        name, typ, unit, labels, help_ = cells
        assert name not in rows, f"{name} listed twice"
        rows[name] = Row(name, typ, unit, frozenset(x.strip() for x in labels.split(",") if x.strip()), help_)
    return rows


@pytest.fixture(scope="module")
def state() -> AgentState:
    """The preempt recording replayed, plus one source error, one journal error and one NVML reading (this CPU
    recording has no GPU) so every family has a sample and its label names can be checked."""
    pipeline = AttributionPipeline()
    source = ReplaySource(RECORDINGS / "preempt")
    for ev in source.events():
        pipeline.feed(ev)
    pipeline.settle()
    assert pipeline.last_event_ts is not None
    pipeline.feed(GpuSample(pipeline.last_event_ts, 0, "GPU-0", 70 << 30, 80 << 30, 37.0, 52.0))
    st = AgentState(pipeline, health={STREAM_SOURCE[k]: h for k, h in source.health.items()},
                    clock=lambda: pipeline.last_event_ts + 1.5 if pipeline.last_event_ts else 0.0)
    st.source("vllm_log").skip("unknown_line")
    st.source("vllm_metrics").error("refused", pipeline.last_event_ts, "connection refused")
    st.source("vllm_metrics").success(pipeline.last_event_ts + 1.0)
    st.journal_errors["write"] += 1
    return st


def exposed_name(family: Metric) -> str:
    return family.name + "_total" if family.type == "counter" else family.name


def label_names(family: Metric) -> frozenset[str]:
    names = {k for s in family.samples for k in s.labels}
    return frozenset(names - {"le"}) if family.type == "histogram" else frozenset(names)


def test_catalog_parses() -> None:
    rows = catalog_rows()
    assert len(rows) >= 30
    assert all(r.type in ("counter", "gauge", "histogram") for r in rows.values())
    assert all(r.name.endswith("_total") == (r.type == "counter") for r in rows.values())
    assert all(not r.unit or re.search(rf"_{r.unit}(_total)?$", r.name) for r in rows.values())


@pytest.mark.parametrize("fmt", ["text", "openmetrics"])
def test_served_series_and_catalog_agree_both_ways(state: AgentState, fmt: str) -> None:
    registry = registry_for(state)
    if fmt == "text":
        families = list(parse_text(generate_latest(registry).decode()))
    else:
        families = list(parse_openmetrics(generate_openmetrics(registry).decode()))
    served = {exposed_name(f): f for f in families}
    assert len(served) == len(families), "a family is served twice"
    rows = catalog_rows()
    assert set(served) - set(rows) == set(), "served but not in docs/metrics.md"
    assert set(rows) - set(served) == set(), "in docs/metrics.md but not served"
    for name, row in rows.items():
        fam = served[name]
        assert fam.type == row.type, name
        assert fam.samples, f"{name} has no sample after replaying preempt"
        assert label_names(fam) == row.labels, name
        assert fam.documentation == row.help, name
        if fmt == "openmetrics":
            assert fam.unit == row.unit, name


def test_describe_names_every_catalog_family_without_reading_state(state: AgentState) -> None:
    described = {exposed_name(f): f.type for f in AgentCollector(state).describe()}
    assert described == {r.name: r.type for r in catalog_rows().values()}
    assert all(not f.samples for f in AgentCollector(state).describe())


def test_both_formats_parse_back_to_the_same_samples(state: AgentState) -> None:
    registry = registry_for(state)
    text = {(s.name, tuple(sorted(s.labels.items()))): s.value
            for f in parse_text(generate_latest(registry).decode()) for s in f.samples}
    om = {(s.name, tuple(sorted(s.labels.items()))): s.value
          for f in parse_openmetrics(generate_openmetrics(registry).decode()) for s in f.samples}
    assert text.keys() == om.keys()
    assert all(text[k] == pytest.approx(om[k]) for k in text)


def test_process_metrics_are_opt_in_and_add_only_process_series(state: AgentState) -> None:
    plain = {f.name for f in parse_text(generate_latest(registry_for(state)).decode())}
    with_process = {f.name for f in parse_text(generate_latest(registry_for(state, process_metrics=True)).decode())}
    assert not any(n.startswith("process_") for n in plain)
    extra = with_process - plain
    assert extra and all(n.startswith("process_") for n in extra)


def test_registry_holds_only_the_agent_collector(state: AgentState) -> None:
    registry = registry_for(state)
    assert isinstance(registry, CollectorRegistry)
    names = {f.name for f in registry.collect()}
    assert all(n.startswith("attrib_") for n in names)


def test_a_fresh_agent_serves_every_family_and_leaves_unknowns_without_a_sample() -> None:
    """At start-up nothing is fed yet: every family is there, the unknowns have no sample (not a false 0)."""
    state = AgentState(AttributionPipeline())
    families = {exposed_name(f): f for f in parse_openmetrics(generate_openmetrics(registry_for(state)).decode())}
    assert set(families) == set(catalog_rows())
    unknown = {name for name, f in families.items() if not f.samples}
    assert unknown == {"attrib_kv_pool_blocks", "attrib_kv_vllm_blocks", "attrib_kv_ledger_residual_blocks",
                       "attrib_cost_model_residual_seconds", "attrib_pipeline_lag_seconds",
                       "attrib_source_up", "attrib_source_success_total", "attrib_source_errors_total",
                       "attrib_source_skipped_total", "attrib_source_last_success_timestamp_seconds",
                       "attrib_journal_errors_total", "attrib_forecast_reference_harm_seconds",
                       "attrib_gpu_memory_used_bytes", "attrib_gpu_memory_total_bytes",
                       "attrib_gpu_dram_bandwidth_ratio"}
    errors = families["attrib_collector_errors_total"].samples
    assert len(errors) == len(SECTIONS) == 9 and all(s.value == 0 for s in errors)
    assert families["attrib_cost_model_fitted"].samples[0].value == 0.0


def test_mounted_app_negotiates_openmetrics_where_exemplars_appear(state: AgentState) -> None:
    app = make_asgi_app(registry_for(state))

    async def get(accept: str) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://agent") as client:
            return await client.get("/metrics", headers={"Accept": accept})

    om = asyncio.run(get("application/openmetrics-text; version=1.0.0"))
    assert om.status_code == 200 and om.headers["content-type"].startswith("application/openmetrics-text")
    assert re.search(r'_bucket\{.*\} \d+\.\d+ # \{trace_id="[0-9a-f]{32}"\}', om.text)
    plain = asyncio.run(get("text/plain"))
    assert plain.headers["content-type"].startswith("text/plain") and '{trace_id=' not in plain.text


def test_agent_metrics_route_is_encoded_once_for_a_gzip_scraper(state: AgentState) -> None:
    """Prometheus asks for gzip; the body must decompress (once) into exposition it can parse."""
    from attrib_agent.agent.core import AgentCore

    core = AgentCore(state.pipeline)
    core.state.health.update(state.health)

    async def get() -> httpx.Response:
        transport = httpx.ASGITransport(app=core.asgi_app(None))
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            return await client.get("/metrics", headers={
                "Accept": "application/openmetrics-text;version=1.0.0,text/plain;version=0.0.4;q=0.5",
                "Accept-Encoding": "gzip"})

    r = asyncio.run(get())
    assert r.status_code == 200 and r.headers.get_list("content-encoding") == ["gzip"]
    body = r.text  # httpx undoes one gzip, as Prometheus does: a body encoded twice stays binary here
    names = {f.name for f in parse_openmetrics(body)}
    assert "attrib_victims_dropped" in names and "attrib_source_up" in names
