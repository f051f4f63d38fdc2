"""A small client for Prometheus's HTTP API: the calls Grafana makes for these dashboards, no more.

Errors come back as `PromQueryError` carrying Prometheus's own message (a parse error names the position),
so a failing check says which panel's expression is wrong and why.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import httpx


class PromQueryError(Exception):
    """Prometheus refused or failed a query (bad PromQL, bad parameters, or not reachable)."""


@dataclass(frozen=True)
class Series:
    labels: dict[str, str]
    points: list[tuple[float, float]]  # (unix seconds, value); NaN kept, as Prometheus returns it

    @property
    def finite(self) -> list[tuple[float, float]]:
        return [(t, v) for t, v in self.points if v == v and abs(v) != float("inf")]


@dataclass(frozen=True)
class Exemplar:
    series: dict[str, str]
    labels: dict[str, str]  # trace_id ...
    value: float
    ts: float


class PrometheusApi:
    def __init__(self, base_url: str, *, timeout_s: float = 10.0, client: httpx.Client | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client or httpx.Client(timeout=timeout_s)

    def close(self) -> None:
        self._client.close()

    def _get(self, path: str, params: dict[str, Any] | list[tuple[str, Any]]) -> Any:
        try:
            r = self._client.get(self.base_url + path, params=params)
        except httpx.HTTPError as e:
            raise PromQueryError(f"{path}: {type(e).__name__}: {e}") from e
        try:
            body = r.json()
        except ValueError as e:
            raise PromQueryError(f"{path}: HTTP {r.status_code}, not JSON") from e
        if body.get("status") != "success":
            raise PromQueryError(f"{path}: {body.get('errorType')}: {body.get('error')}")
        return body["data"]

    def query(self, expr: str, ts: float | None = None) -> list[Series]:
        params: dict[str, Any] = {"query": expr}
        if ts is not None:
            params["time"] = ts
        data = self._get("/api/v1/query", params)
        if data["resultType"] == "scalar":
            t, v = data["result"]
            return [Series({}, [(float(t), float(v))])]
        return [Series(s["metric"], [(float(s["value"][0]), float(s["value"][1]))]) for s in data["result"]]

    def query_range(self, expr: str, start: float, end: float, step: float) -> list[Series]:
        data = self._get("/api/v1/query_range", {"query": expr, "start": start, "end": end, "step": step})
        return [Series(s["metric"], [(float(t), float(v)) for t, v in s["values"]]) for s in data["result"]]

    def label_values(self, label: str, match: str | None = None) -> list[str]:
        params = [("match[]", match)] if match else []
        return [str(v) for v in self._get(f"/api/v1/label/{label}/values", params)]

    def exemplars(self, expr: str, start: float, end: float) -> list[Exemplar]:
        data = self._get("/api/v1/query_exemplars", {"query": expr, "start": start, "end": end})
        return [Exemplar(s["seriesLabels"], e["labels"], float(e["value"]), float(e["timestamp"]))
                for s in data for e in s["exemplars"]]

    def ready(self) -> bool:
        try:
            return self._client.get(self.base_url + "/-/ready").status_code == 200
        except httpx.HTTPError:
            return False

    def rules(self) -> list[dict[str, Any]]:
        """Every loaded rule with its health and last error (groups flattened)."""
        return [r for g in self._get("/api/v1/rules", {})["groups"] for r in g["rules"]]

    def alerts(self) -> list[dict[str, Any]]:
        """Active alerts (pending and firing), annotations expanded."""
        return list(self._get("/api/v1/alerts", {})["alerts"])

    def targets(self) -> list[dict[str, Any]]:
        """Active scrape targets with their health and last scrape error."""
        return list(self._get("/api/v1/targets", {"state": "active"})["activeTargets"])
