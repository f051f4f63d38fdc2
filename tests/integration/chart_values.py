"""The chart's supported values sets, in one place for both checkers: helm-render renders them (as `-f` files)
and real Helm lints them (test_helm_lint.py); every mode goes with every set.
"""

from __future__ import annotations

import hashlib
import tempfile
from pathlib import Path
from typing import Any

import real_helm  # tools/helm_render/real_helm.py, put on sys.path by conftest.py
import yaml  # type: ignore[import-untyped]

# deploy: the chart runs vLLM. sidecar-only: names as production-stack's chart gives them (its Deployment
# vllm-<model>-deployment-vllm, container port `container-port`), the pod patch's main user.
MODES: dict[str, dict[str, Any]] = {
    "deploy": {"vllm": {"model": "Qwen/Qwen2.5-1.5B-Instruct"}},
    "sidecar-only": {"mode": "sidecar-only", "sidecar": {
        "podSelector": {"app.kubernetes.io/name": "vllm"}, "deploymentName": "vllm-llama3-deployment-vllm",
        "vllmPortName": "container-port"}},
}
VALUE_SETS: dict[str, dict[str, Any]] = {
    "defaults": {},  # no API token
    "monitors": {"serviceMonitor": {"enabled": True, "labels": {"release": "kube-prometheus-stack"}},
                 "podMonitor": {"enabled": True}, "prometheusRule": {"enabled": True},
                 "dashboards": {"enabled": True}, "networkPolicy": {"enabled": True}},
    # a token from the user's Secret, with the monitors that must send it
    "token-secret": {"agent": {"apiToken": {"existingSecret": "attrib-token"}},
                     "serviceMonitor": {"enabled": True}, "podMonitor": {"enabled": True},
                     "vllm": {"hfToken": {"existingSecret": "hf-token"}, "modelCache": {"existingClaim": "models"}},
                     "runtimeClassName": "nvidia", "strategy": {"type": "Recreate"}},
    # a token the chart makes a Secret of, and the agent's optional outputs
    "forward-journal": {"agent": {"apiToken": {"value": "s3cr3t-t0ken"},
                                  "otlp": {"forward": "grpc://otel-collector.obs:4317"},
                                  "journal": {"enabled": True, "existingClaim": "attrib-journal"},
                                  "nvml": {"enabled": True, "visibleDevices": "all"}}},
    "exact-mode": {"exactMode": {"enabled": True}},
    "exact-mode-image": {"exactMode": {"enabled": True, "install": "image"}},
}
# sidecar-only for vLLM's example chart (examples/online_serving/chart-helm): its release and image.command.
VLLM_EXAMPLE_CHART: dict[str, Any] = {"sidecar": {"vllmChart": {
    "releaseName": "myvllm", "command": ["vllm", "serve", "/data/", "--served-model-name", "opt-125m"]}}}


def merged(*layers: dict[str, Any]) -> dict[str, Any]:
    """The layers as one values file would hold them (later wins; maps merge, as Helm coalesces them)."""
    out: dict[str, Any] = {}
    for layer in layers:
        out = real_helm.coalesce(out, layer)
    return out


def values_file(values: dict[str, Any]) -> Path:
    """A YAML file holding `values`, named by its content (written once per content per machine)."""
    text = yaml.safe_dump(values, sort_keys=True)
    where = Path(tempfile.gettempdir()) / "attrib-chart-values"
    where.mkdir(exist_ok=True)
    path = where / f"{hashlib.sha256(text.encode()).hexdigest()[:16]}.yaml"
    if not path.exists():
        tmp = path.with_suffix(f".{id(text)}.tmp")
        tmp.write_text(text)
        tmp.replace(path)
    return path
