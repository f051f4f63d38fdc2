"""Read a dashboard's queries back out of its JSON and fill its variables, as Grafana would before querying.

Used by the Prometheus check (every panel's expression must parse and return data) and by the preview
renderer; both work from the committed JSON, so what is checked is what operators import.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Final

_VAR: Final = re.compile(r"\$\{(\w+)(?::\w+)?\}|\[\[(\w+)\]\]|\$(\w+)")
_LABEL_VALUES: Final = re.compile(r"^label_values\((?:(?P<match>.+),\s*)?(?P<label>\w+)\)$", re.S)


class UnfilledVariableError(ValueError):
    """An expression names a variable the caller gave no value for."""


@dataclass(frozen=True)
class PanelQuery:
    panel_id: int
    panel: str  # title
    panel_type: str
    ref_id: str
    expr: str
    legend: str
    instant: bool
    heatmap: bool
    exemplar: bool


def panels(model: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
    """Every panel, rows' nested panels (collapsed rows) included, rows themselves excluded."""
    for p in model.get("panels", []):
        if p.get("type") == "row":
            yield from p.get("panels", [])
        else:
            yield p


def panel_queries(model: Mapping[str, Any]) -> list[PanelQuery]:
    out = []
    for p in panels(model):
        for t in p.get("targets", []):
            out.append(PanelQuery(panel_id=p["id"], panel=p.get("title", ""), panel_type=p["type"],
                                  ref_id=t.get("refId", ""), expr=t["expr"], legend=t.get("legendFormat", ""),
                                  instant=bool(t.get("instant")) and not t.get("range"),
                                  heatmap=t.get("format") == "heatmap", exemplar=bool(t.get("exemplar"))))
    return out


@dataclass(frozen=True)
class LabelValuesQuery:
    """A `label_values(match, label)` variable: Prometheus's /api/v1/label/<label>/values?match[]=<match>."""

    variable: str
    label: str
    match: str | None


def variable_queries(model: Mapping[str, Any]) -> list[LabelValuesQuery]:
    out = []
    for v in model.get("templating", {}).get("list", []):
        if v.get("type") != "query":
            continue
        m = _LABEL_VALUES.match(str(v["query"]).strip())
        if not m:
            raise ValueError(f"variable {v['name']}: only label_values(...) queries are supported: {v['query']!r}")
        out.append(LabelValuesQuery(v["name"], m["label"], m["match"]))
    return out


def fill(expr: str, values: Mapping[str, str]) -> str:
    """Replace `$var`, `${var}` and `[[var]]` by their values; a variable without a value is an error."""
    def sub(m: re.Match[str]) -> str:
        name = m.group(1) or m.group(2) or m.group(3)
        if name not in values:
            raise UnfilledVariableError(f"no value for ${name} in {expr!r}")
        return values[name]
    return _VAR.sub(sub, expr)


def grafana_values(variables: Mapping[str, str], *, rate_interval: str, range_s: float,
                   interval: str = "1s") -> dict[str, str]:
    """The dashboard variables plus Grafana's built-ins the panels use."""
    return {**variables, "__rate_interval": rate_interval, "__interval": interval,
            "__range": f"{max(1, round(range_s))}s", "__range_s": str(max(1, round(range_s)))}
