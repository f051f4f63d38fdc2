"""The pieces both dashboards share: datasource, variables, label selectors and a few panel shapes.

Every panel is built from `Query` rows so the expressions stay data: the Prometheus check and the preview
renderer read them back out of the JSON. Selectors are the one place the variables enter a query: vLLM's
series carry `model_name`, the agent's do not (it is the pod's sidecar), so `model` narrows the pod list.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final
from urllib.parse import quote

from grafana_foundation_sdk.builders import common as common_b
from grafana_foundation_sdk.builders import dashboard as dash_b
from grafana_foundation_sdk.builders import heatmap as heatmap_b
from grafana_foundation_sdk.builders import prometheus as prom_b
from grafana_foundation_sdk.builders import stat as stat_b
from grafana_foundation_sdk.builders import timeseries as ts_b
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import common
from grafana_foundation_sdk.models import dashboard as dash_m
from grafana_foundation_sdk.models import heatmap as heatmap_m
from grafana_foundation_sdk.models import prometheus as prom_m

PROMETHEUS: Final = dash_m.DataSourceRef(type_val="prometheus", uid="${datasource}")
# Exemplar clicks open traces through the Prometheus datasource's exemplarTraceIdDestinations; this variable picks
# the trace store for the "Slowed victims' traces" link. Jaeger users: set this to "jaeger" and rebuild.
TRACE_DATASOURCE_TYPE: Final = "tempo"
# A series every vLLM exposes while up, with the labels the variables list (namespace/pod from the scrape config).
VLLM_ANCHOR: Final = "vllm:num_requests_running"
VLLM_SELECTOR: Final = 'namespace=~"$namespace", pod=~"$pod", model_name=~"$model"'
AGENT_SELECTOR: Final = 'namespace=~"$namespace", pod=~"$pod"'
RATE: Final = "$__rate_interval"
TAGS: Final = ["vllm", "attrib-agent"]
# Explore on the trace datasource: the agent's `attrib.slowdown` spans (children of the victim's llm_request span)
# of short requests slowed by over 0.5 s. TraceQL (Tempo); Jaeger users search for the span name by hand.
SLOWED_VICTIMS_TRACEQL: Final = ('{ name = "attrib.slowdown" && span.attrib.victim_class = "short" '
                                 '&& span.attrib.slowdown_s > 0.5 }')
_SLOW_TRACES: Final = {"datasource": "${trace_datasource}", "queries": [
    {"refId": "A", "queryType": "traceql", "query": SLOWED_VICTIMS_TRACEQL}]}
SLOW_TRACES_URL: Final = "/explore?left=" + quote(json.dumps(_SLOW_TRACES, separators=(",", ":")), safe="${}")


def vllm(metric: str, *matchers: str) -> str:
    """A vLLM series under the dashboard's namespace/pod/model selection."""
    return f"{metric}{{{', '.join((VLLM_SELECTOR, *matchers))}}}"


def agent(metric: str, *matchers: str) -> str:
    """An agent series under the dashboard's namespace/pod selection."""
    return f"{metric}{{{', '.join((AGENT_SELECTOR, *matchers))}}}"


@dataclass(frozen=True)
class Query:
    expr: str
    legend: str = ""
    exemplar: bool = False  # histogram panels: Grafana fetches exemplars (trace_id) beside the series
    heatmap: bool = False  # cumulative `le` buckets Grafana turns into a heatmap
    instant: bool = False


def _targets(queries: Sequence[Query]) -> list[prom_b.Dataquery]:
    out = []
    for i, q in enumerate(queries):
        t = prom_b.Dataquery().ref_id(chr(ord("A") + i)).expr(q.expr).exemplar(q.exemplar)
        t = t.legend_format(q.legend or "__auto").editor_mode(prom_m.QueryEditorMode.CODE)
        if q.heatmap:
            t = t.format(prom_m.PromQueryFormat.HEATMAP)
        t = t.instant() if q.instant else t.range()
        out.append(t)
    return out


def _legend(table: bool = False) -> common_b.VizLegendOptions:
    mode = common.LegendDisplayMode.TABLE if table else common.LegendDisplayMode.LIST
    return common_b.VizLegendOptions().display_mode(mode).placement(common.LegendPlacement.BOTTOM).show_legend(True)


def timeseries(title: str, description: str, unit: str, queries: Sequence[Query], *, width: int = 8,
               height: int = 8, stacked: bool = False, bars: bool = False, steps: bool = False) -> ts_b.Panel:
    """A time series panel; `stacked` for parts of a whole (causes), `bars` for counts per interval."""
    p = (ts_b.Panel().title(title).description(description).datasource(PROMETHEUS).unit(unit)
         .span(width).height(height).targets(list(_targets(queries))).legend(_legend())
         .tooltip(common_b.VizTooltipOptions().mode(common.TooltipDisplayMode.MULTI).sort(common.SortOrder.DESCENDING))
         .fill_opacity(25 if stacked or bars else 8).line_width(1).span_nulls(False))
    if stacked:
        p = p.stacking(common_b.StackingConfig().mode(common.StackingMode.NORMAL))
    if bars:
        p = p.draw_style(common.GraphDrawStyle.BARS)
    if steps:
        p = p.line_interpolation(common.LineInterpolation.STEP_AFTER)
    return p


def zero_lines(expr: str, by: str) -> str:
    """`expr`, or a zero line per `by` (kind="none") when nothing happened: "No data" would hide whether the agent
    is there at all. The failure counters have no series until the first failure."""
    return f'{expr} or label_replace(0 * sum by ({by}) ({agent("attrib_source_up")}), "kind", "none", "", "")'


def stat(title: str, description: str, unit: str, queries: Sequence[Query], *, width: int = 4, height: int = 4,
         red_at: float | None = None, show: str = "auto") -> stat_b.Panel:
    """A single number (last value); turns red at `red_at` when given; `show="name"` shows the legend instead."""
    steps = [dash_m.Threshold(value=None, color="green")]
    if red_at is not None:
        steps.append(dash_m.Threshold(value=red_at, color="red"))
    return (stat_b.Panel().title(title).description(description).datasource(PROMETHEUS).unit(unit)
            .span(width).height(height).targets(list(_targets(queries)))
            .reduce_options(common_b.ReduceDataOptions().calcs(["lastNotNull"]).values(False))
            .graph_mode(common.BigValueGraphMode.AREA).color_mode(common.BigValueColorMode.VALUE)
            .text_mode(common.BigValueTextMode(show))
            .thresholds(dash_b.ThresholdsConfig().mode(dash_m.ThresholdsMode.ABSOLUTE).steps(steps)))


def heatmap(title: str, description: str, query: Query, *, width: int = 8, height: int = 8) -> heatmap_b.Panel:
    """Histogram buckets over time, exemplars drawn on top (each a victim's trace)."""
    return (heatmap_b.Panel().title(title).description(description).datasource(PROMETHEUS).unit("s")
            .span(width).height(height).targets(list(_targets([query]))).calculate(False)
            .color(heatmap_b.HeatmapColorOptions().mode(heatmap_m.HeatmapColorMode.SCHEME).scheme("Oranges")
                   .scale(heatmap_m.HeatmapColorScale.EXPONENTIAL).exponent(0.5).steps(64))
            .show_tooltip().show_legend().exemplars_color("rgba(64,160,255,0.9)"))


def variables() -> list[dash_b.QueryVariable | dash_b.DatasourceVariable]:
    """datasource, trace datasource, namespace -> model -> pod (each narrowing the next)."""
    def label_values(name: str, label: str, series: str, *, multi: bool) -> dash_b.QueryVariable:
        return (dash_b.QueryVariable(name).id(name).label(label).datasource(PROMETHEUS).query(series)
                .refresh(dash_m.VariableRefresh.ON_TIME_RANGE_CHANGED).sort(dash_m.VariableSort.ALPHABETICAL_ASC)
                .multi(multi).include_all(multi).all_value(".*" if multi else ""))
    return [
        dash_b.DatasourceVariable("datasource").id("datasource").label("Prometheus").type("prometheus"),
        dash_b.DatasourceVariable("trace_datasource").id("trace_datasource").label("Traces")
        .type(TRACE_DATASOURCE_TYPE),
        label_values("namespace", "Namespace", f"label_values({VLLM_ANCHOR}, namespace)", multi=False),
        label_values("model", "Model", f'label_values({VLLM_ANCHOR}{{namespace=~"$namespace"}}, model_name)',
                     multi=True),
        label_values("pod", "Pod", f'label_values({VLLM_ANCHOR}{{namespace=~"$namespace", model_name=~"$model"}}, pod)',
                     multi=True),
    ]


@dataclass(frozen=True)
class Section:
    """A row title and the panels under it (laid out left to right, wrapping at 24 columns)."""

    title: str
    panels: Sequence[Any]  # panel builders


def build_dashboard(uid: str, title: str, description: str, sections: Sequence[Section]) -> dict[str, Any]:
    """Grafana's JSON model of a dashboard with the shared settings (variables, tags, crosshair, 1 h, 30 s).

    Rows are expanded, so their panels follow them at the top level (Grafana nests panels only in collapsed
    rows); ids are numbered in layout order.
    """
    d = (dash_b.Dashboard(title).uid(uid).description(description).tags(TAGS).editable()
         .tooltip(dash_m.DashboardCursorSync.CROSSHAIR).time("now-1h", "now").refresh("30s").timezone("browser")
         .link(dash_b.DashboardLink("attrib-agent").type(dash_m.DashboardLinkType.DASHBOARDS).tags(["attrib-agent"])
               .as_dropdown(True).include_vars(True).keep_time(True))
         .link(dash_b.DashboardLink("Slowed victims' traces").type(dash_m.DashboardLinkType.LINK).icon("external link")
               .url(SLOW_TRACES_URL).keep_time(True).tooltip("short requests slowed by over 0.5 s, in the trace store")
               .target_blank(True)))
    for v in variables():
        d = d.with_variable(v)
    for section in sections:
        d = d.with_row(dash_b.Row(section.title))
        for panel in section.panels:
            d = d.with_panel(panel)
    model = json.loads(json.dumps(d.build(), cls=JSONEncoder))
    assert isinstance(model, dict)
    for i, panel in enumerate(model.get("panels", []), start=1):
        panel["id"] = i
    return model
