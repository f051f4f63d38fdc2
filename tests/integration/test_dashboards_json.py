"""The committed dashboard JSON: generated from the code, well formed, and every name it queries exists.

Names are checked against their sources of truth: the agent's series against the metrics catalog
(docs/metrics.md), vLLM's against a real recorded /metrics body.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from attrib_agent.recording import METRICS, Recording
from dashboards.build import DASHBOARDS, JSON_DIR, drifted, render
from dashboards.prom_api import PrometheusApi, PromQueryError
from dashboards.queries import UnfilledVariableError, fill, grafana_values, panel_queries, panels, variable_queries

RULES = REPO / "dashboards" / "rules" / "attrib-agent.rules.yml"
MODELS = {name: json.loads(text) for name, text in render().items()}
_METRIC = re.compile(r"\b(attrib_\w+|vllm:\w+)(\{[^}]*\})?")


def _catalog() -> set[str]:
    rows = (line.split("|") for line in (REPO / "docs" / "metrics.md").read_text().splitlines())
    return {cells[1].strip() for cells in rows if len(cells) > 3 and cells[1].strip().startswith("attrib_")}


def _recorded_vllm_names() -> set[str]:
    rec = Recording(REPO / "tests" / "fixtures" / "recordings" / "preempt")
    body = str(next(iter(rec.records(METRICS)))["text"])
    return {line.split("{")[0].split(" ")[0] for line in body.splitlines() if line.startswith("vllm:")}


def _exprs() -> list[tuple[str, str]]:
    return [(f"{name}: {q.panel}", q.expr) for name, m in MODELS.items() for q in panel_queries(m)]


def _rule_exprs() -> list[tuple[str, str]]:
    text = RULES.read_text()
    return [(f"rule {m[1]}", m[2]) for m in re.finditer(r"- alert: (\w+)\n(?:.*\n)*?\s+expr: \|?\n?((?:.*\n)+?)"
                                                         r"\s+for:", text)]


def test_committed_json_matches_the_code() -> None:
    assert sorted(p.name for p in JSON_DIR.glob("*.json")) == sorted(DASHBOARDS)
    assert drifted() == [], "dashboards/json is stale: run `.venv/bin/python -m dashboards.build`"


def test_drift_is_detected(tmp_path: Path) -> None:
    for name, text in render().items():
        (tmp_path / name).write_text(text.replace('"refresh": "30s"', '"refresh": "1m"'))
    assert sorted(drifted(tmp_path)) == sorted(DASHBOARDS)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_layout_ids_and_refs(name: str) -> None:
    model = MODELS[name]
    ids = [p["id"] for p in model["panels"]]
    assert len(ids) == len(set(ids))
    cells: set[tuple[int, int]] = set()
    for p in model["panels"]:
        g = p["gridPos"]
        assert g["x"] + g["w"] <= 24, p["title"]
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"]) for y in range(g["y"], g["y"] + g["h"])}
        assert not mine & cells, f"{p['title']} overlaps another panel"
        cells |= mine
    for p in panels(model):
        refs = [t["refId"] for t in p["targets"]]
        assert refs and len(refs) == len(set(refs)), p["title"]
        assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}, p["title"]
        assert p.get("description"), f"{p['title']}: a panel says what it answers"


@pytest.mark.parametrize("name", sorted(MODELS))
def test_variables(name: str) -> None:
    model = MODELS[name]
    names = [v["name"] for v in model["templating"]["list"]]
    assert names == ["datasource", "trace_datasource", "namespace", "model", "pod"]
    kinds = {v["name"]: v.get("query") for v in model["templating"]["list"] if v["type"] == "datasource"}
    assert kinds == {"datasource": "prometheus", "trace_datasource": "tempo"}
    assert [(v.variable, v.label) for v in variable_queries(model)] == [
        ("namespace", "namespace"), ("model", "model_name"), ("pod", "pod")]


def test_every_series_is_selected_by_namespace_and_pod() -> None:
    for where, expr in _exprs():
        for m in _METRIC.finditer(expr):
            sel = m.group(2) or ""
            assert 'namespace=~"$namespace"' in sel and 'pod=~"$pod"' in sel, f"{where}: {m.group(0)}"
            if m.group(1).startswith("vllm:"):
                assert 'model_name=~"$model"' in sel, f"{where}: {m.group(0)}"


def test_histogram_queries_ask_for_exemplars() -> None:
    for name, model in MODELS.items():
        for q in panel_queries(model):
            if "_bucket" in q.expr:
                assert q.exemplar, f"{name}: {q.panel}"


def test_expressions_fill_completely() -> None:
    values = grafana_values({"namespace": "ns", "pod": "p", "model": "m"}, rate_interval="1m", range_s=3600)
    for where, expr in _exprs():
        assert "$" not in fill(expr, values), where
    with pytest.raises(UnfilledVariableError, match=r"\$pod"):
        fill('up{pod=~"$pod"}', {})


def _base_name(name: str, catalog: set[str]) -> str:
    for suffix in ("_bucket", "_sum", "_count"):
        if name.endswith(suffix) and name.removesuffix(suffix) in catalog:
            return name.removesuffix(suffix)
    return name


def test_agent_names_are_in_the_metrics_catalog() -> None:
    catalog = _catalog()
    assert len(catalog) > 20
    rules = _rule_exprs()
    assert len(rules) == 5
    used = {_base_name(m.group(1), catalog) for _, e in _exprs() + rules for m in _METRIC.finditer(e)}
    missing = {n for n in used if n.startswith("attrib_")} - catalog
    assert not missing, f"queried but not in docs/metrics.md: {sorted(missing)}"


def test_vllm_names_exist_in_a_recorded_body() -> None:
    recorded = _recorded_vllm_names()
    used = {m.group(1) for _, e in _exprs() + _rule_exprs() for m in _METRIC.finditer(e)}
    missing = {n for n in used if n.startswith("vllm:")} - recorded
    assert not missing, f"not in vLLM 0.32's /metrics: {sorted(missing)}"


def test_docs_describe_every_panel() -> None:
    doc = (REPO / "docs" / "dashboards.md").read_text()
    titles: list[Any] = [p["title"] for m in MODELS.values() for p in panels(m)]
    assert [t for t in titles if t not in doc] == []


def test_fill_forms_and_errors() -> None:
    assert fill('a{pod=~"${pod}", ns="[[namespace]]"}[$__rate_interval]',
                {"pod": "p", "namespace": "n", "__rate_interval": "10s"}) == 'a{pod=~"p", ns="n"}[10s]'
    assert fill("x{pod=~\"${pod:regex}\"}", {"pod": "p"}) == 'x{pod=~"p"}'
    with pytest.raises(ValueError, match="only label_values"):
        variable_queries({"templating": {"list": [{"type": "query", "name": "v", "query": "query_result(up)"}]}})


def test_unreachable_prometheus_is_a_clear_error() -> None:
    api = PrometheusApi("http://127.0.0.1:9")  # discard port: nothing listens
    with pytest.raises(PromQueryError, match="/api/v1/query: ConnectError"):
        api.query("up")
    assert not api.ready()
    api.close()


def test_the_interference_dashboard_plots_the_forecast_gauge_per_pod_and_engine() -> None:
    """Issue 16: the dashboards show the forecast gauge (a router's signal). Its query returning data from a
    replayed agent through a real Prometheus is test_prometheus_replay's `Forecast harm...` case."""
    model = MODELS["attrib-interference.json"]
    hits = [q for q in panel_queries(model) if "attrib_forecast_reference_harm_seconds" in q.expr]
    assert len(hits) == 1, "the Interference dashboard must plot attrib_forecast_reference_harm_seconds"
    q = hits[0]
    assert q.panel_type == "timeseries" and not q.instant
    assert "by (pod, engine)" in q.expr and "{{pod}}" in q.legend and "{{engine}}" in q.legend
    [panel] = [p for p in panels(model) if p["title"] == q.panel]
    assert panel["fieldConfig"]["defaults"]["unit"] == "s"
    assert "attrib_forecast_reference_harm_seconds" in _catalog()  # documented in docs/metrics.md
