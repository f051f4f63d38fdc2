"""One logging config for vLLM: the by-hand recipe's deploy/vllm-logging.json is the chart's, rendered with
its default values (the chart's config is run through vLLM's own formatter in test_helm_pod_patch.py)."""

from __future__ import annotations

import json
from pathlib import Path

import chart_check  # tools/helm_render/chart_check.py, put on sys.path by conftest.py

REPO = Path(__file__).resolve().parents[2]


def test_the_shipped_logging_config_is_the_charts(renderer: Path) -> None:
    out = chart_check.render(renderer, kube_version="1.33", sets=["vllm.model=m"])
    cm = next(m for m in out.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-vllm-logging"))
    shipped = json.loads((REPO / "deploy" / "vllm-logging.json").read_text())
    assert json.loads(cm["data"]["vllm-logging.json"]) == shipped
