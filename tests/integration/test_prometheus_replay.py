"""Every dashboard query and alert rule against a real Prometheus scraping a replayed recording.

Each panel's expression, variables filled as Grafana would, must parse and return at least one series with
a finite value over the replay; each variable must list the relabelled value; the rules must load and
evaluate, and the interference alert must go pending on the `preempt` recording (whales slow the shorts).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest
from conftest import LABELS, MODEL, RATE_INTERVAL, REPO, ReplayStack

from dashboards import preview
from dashboards.build import JSON_DIR
from dashboards.prom_api import PromQueryError
from dashboards.queries import PanelQuery, fill, grafana_values, panel_queries, variable_queries

pytestmark = pytest.mark.integration

DASHBOARDS = sorted(JSON_DIR.glob("*.json"))
QUERIES = [(path.name, q) for path in DASHBOARDS for q in panel_queries(json.loads(path.read_text()))]


def _values(stack: ReplayStack) -> dict[str, str]:
    return grafana_values(stack.variables, rate_interval=RATE_INTERVAL, range_s=stack.end - stack.start)


@pytest.mark.parametrize(("dashboard", "query"), QUERIES,
                         ids=[f"{d.removesuffix('.json')}:{q.panel}:{q.ref_id}" for d, q in QUERIES])
def test_panel_query_returns_data(replay_stack: ReplayStack, dashboard: str, query: PanelQuery) -> None:
    expr = fill(query.expr, _values(replay_stack))
    api = replay_stack.api
    series = (api.query(expr, replay_stack.end) if query.instant
              else api.query_range(expr, replay_stack.start, replay_stack.end, 1.0))
    assert series, f"{dashboard} panel {query.panel!r} [{query.ref_id}] returned no series: {expr}"
    assert any(s.finite for s in series), f"{dashboard} panel {query.panel!r}: only NaN/Inf values: {expr}"


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_variables_list_the_scraped_values(replay_stack: ReplayStack, path: Path) -> None:
    expected = {"namespace": LABELS["namespace"], "pod": LABELS["pod"], "model": MODEL}
    for v in variable_queries(json.loads(path.read_text())):
        match = fill(v.match, replay_stack.variables) if v.match else None
        values = replay_stack.api.label_values(v.label, match)
        assert expected[v.variable] in values, f"${v.variable}: label_values({match}, {v.label}) gave {values}"


def test_victims_exemplars_reach_prometheus(replay_stack: ReplayStack) -> None:
    """The agent's slowdown histogram carries each victim's trace_id through Prometheus's exemplar storage."""
    found = replay_stack.api.exemplars('attrib_victim_slowdown_seconds_bucket{victim_class="short"}',
                                       replay_stack.recording_start - 60, replay_stack.end)
    assert found, "no exemplars on attrib_victim_slowdown_seconds_bucket"
    assert all(re.fullmatch(r"[0-9a-f]{32}", e.labels.get("trace_id", "")) for e in found), found[:3]
    assert {e.series["pod"] for e in found} == {LABELS["pod"]}


def test_a_bad_expression_reports_prometheus_error(replay_stack: ReplayStack) -> None:
    """The check would catch a broken panel: Prometheus's parse error comes back, not an empty result."""
    with pytest.raises(PromQueryError, match="bad_data: .*parse error"):
        replay_stack.api.query_range("sum by (pod) (rate(attrib_engine_steps_total[10s])", replay_stack.start,
                                     replay_stack.end, 1.0)


def test_rules_load_and_evaluate(replay_stack: ReplayStack) -> None:
    rules = replay_stack.api.rules()
    assert len(rules) >= 5
    bad = [(r["name"], r.get("lastError")) for r in rules if r.get("health") != "ok"]
    assert not bad, bad


def test_interference_alert_pending_on_the_preempt_recording(replay_stack: ReplayStack) -> None:
    """Whales slow the shorts in `preempt`: the alert's condition holds (pending: `for: 5m` has not passed)."""
    alerts = {a["labels"]["alertname"]: a for a in replay_stack.api.alerts()}
    a = alerts.get("AttribShortRequestsSlowedByInterference")
    assert a is not None, sorted(alerts)
    assert a["state"] == "pending" and a["labels"]["pod"] == LABELS["pod"]
    assert "Top culprit: whale requests through" in a["annotations"]["description"], a["annotations"]
    assert "AttribNotAttributing" not in alerts  # vLLM finished requests and the agent attributed them
    assert "AttribSourceDown" not in alerts


@pytest.mark.parametrize("path", DASHBOARDS, ids=[p.stem for p in DASHBOARDS])
def test_preview_renders_from_real_data(replay_stack: ReplayStack, path: Path, tmp_path: Path,
                                        request: pytest.FixtureRequest) -> None:
    """Draw the panels from this run's data; `--update-golden` also refreshes docs/img/dashboard-*.png."""
    model = json.loads(path.read_text())
    s = replay_stack
    data = preview.fetch(s.api, model, _values(s), s.start, s.end, exemplar_shift_s=s.start - s.recording_start)
    subtitle = "replay of tests/fixtures/recordings/preempt through attrib-agent replay, scraped by Prometheus"
    page, height = preview.render_html(model, data, s.start, s.end, subtitle)
    png = preview.screenshot(page, height, tmp_path / f"dashboard-{path.stem.removeprefix('attrib-')}.png")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 20_000
    if request.config.getoption("--update-golden"):
        shutil.copy(png, REPO / "docs" / "img" / png.name)
