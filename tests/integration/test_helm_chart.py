"""The Helm chart, rendered the way `helm template` renders it (tools/helm_render) and checked for real.

Every manifest of both modes, for Kubernetes 1.28, 1.29 and 1.33 and several value sets, validates against
Kubernetes' own schemas (kubernetes-validate, strict); the Prometheus Operator's objects against the part of
their CRDs the chart uses; the PrometheusRule with promtool. The agent is a native sidecar from 1.29 on; the
vLLM flags are accepted by vLLM 0.32's own parser and the agent's by its own; the logging config, applied by
Python's dictConfig with vLLM's formatter, writes lines the agent's parser reads.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import chart_check  # tools/helm_render/chart_check.py, put on sys.path by conftest.py
import jsonschema  # type: ignore[import-untyped]
import pytest
import yaml  # type: ignore[import-untyped]
from chart_values import MODES, VALUE_SETS, merged, values_file

REPO = Path(__file__).resolve().parents[2]


cc = chart_check
KUBE_VERSIONS = ("1.28", "1.29", "1.33")
VALIDATE_ALSO = ("1.29", "1.33")  # every render is also checked against these, as the issue asks
_DURATION = {"type": "string", "pattern": "^(0|([0-9]+(ms|s|m|h|d|w|y))+)$"}
_SECRET_KEY = {"type": "object", "additionalProperties": False, "required": ["name", "key"],
               "properties": {"name": {"type": "string"}, "key": {"type": "string"}}}
_AUTH = {"type": "object", "additionalProperties": False, "required": ["type", "credentials"],
         "properties": {"type": {"const": "Bearer"}, "credentials": _SECRET_KEY}}
_ENDPOINT = {"type": "object", "additionalProperties": False, "required": ["port"], "properties": {
    "port": {"type": "string"}, "path": {"type": "string"}, "interval": _DURATION, "scrapeTimeout": _DURATION,
    "authorization": _AUTH}}
_LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
_META = {"type": "object", "required": ["name", "namespace"],
         "properties": {"name": {"type": "string", "maxLength": 253}, "labels": _LABELS}}
_SELECTOR = {"type": "object", "additionalProperties": False, "properties": {
    "matchLabels": {"type": "object", "minProperties": 1, "additionalProperties": {"type": "string"}}}}
_NS_SELECTOR = {"type": "object", "additionalProperties": False,
                "properties": {"matchNames": {"type": "array", "items": {"type": "string"}}}}


def _cr(spec: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "additionalProperties": False, "required": ["apiVersion", "kind", "metadata", "spec"],
            "properties": {"apiVersion": {"const": "monitoring.coreos.com/v1"}, "kind": {"type": "string"},
                           "metadata": _META, "spec": spec}}


# The fields of the Prometheus Operator's CRDs (monitoring.coreos.com/v1) the chart writes, with their types:
# kubernetes-validate has no CRD schemas, so these guard the names and shapes the chart uses.
CR_SCHEMAS = {
    "ServiceMonitor": _cr({"type": "object", "additionalProperties": False, "required": ["selector", "endpoints"],
                           "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                                          "endpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}),
    "PodMonitor": _cr({"type": "object", "additionalProperties": False, "required": ["selector", "podMetricsEndpoints"],
                       "properties": {"selector": _SELECTOR, "namespaceSelector": _NS_SELECTOR,
                                      "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": _ENDPOINT}}}),
    "PrometheusRule": _cr({"type": "object", "additionalProperties": False, "required": ["groups"], "properties": {
        "groups": {"type": "array", "minItems": 1, "items": {
            "type": "object", "required": ["name", "rules"], "additionalProperties": False, "properties": {
                "name": {"type": "string"}, "interval": _DURATION, "rules": {"type": "array", "items": {
                    "type": "object", "required": ["expr"], "additionalProperties": False, "properties": {
                        "alert": {"type": "string"}, "record": {"type": "string"}, "expr": {"type": "string"},
                        "for": _DURATION, "keep_firing_for": _DURATION,
                        "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                        "annotations": {"type": "object", "additionalProperties": {"type": "string"}}}}}}}}}}),
}


def render(renderer: Path, mode: str, sets: list[str], kube: str = "1.33", values: str = "defaults", **kw: Any) -> Any:
    """The chart in `mode` with the values set `values` (a -f file) and then `sets` (--set)."""
    files = [values_file(merged(MODES[mode], VALUE_SETS[values]))]
    return cc.render(renderer, kube_version=kube, sets=sets, values_files=files, **kw)


def pod_spec(out: Any, mode: str) -> dict[str, Any]:
    """The pod spec the agent ends up in: the Deployment's, or the kustomize patch's in sidecar-only mode."""
    if mode == "deploy":
        return out.one("Deployment")["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    patch = yaml.safe_load(pod_patch(out)["kustomize-patch.yaml"])
    return patch["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def pod_patch(out: Any) -> dict[str, str]:
    return next(  # type: ignore[no-any-return]
        m for m in out.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-pod-patch"))["data"]


def containers_named(spec: dict[str, Any], field: str, name: str) -> list[dict[str, Any]]:
    return [c for c in spec.get(field, []) if c["name"] == name]


@pytest.mark.parametrize("values", sorted(VALUE_SETS))
@pytest.mark.parametrize("kube", KUBE_VERSIONS)
@pytest.mark.parametrize("mode", sorted(MODES))
def test_every_manifest_validates(renderer: Path, mode: str, kube: str, values: str) -> None:
    out = render(renderer, mode, [], kube, values)
    versions = sorted({kube, *VALIDATE_ALSO})
    errors, unknown = cc.validate_manifests(out.manifests, versions)
    assert errors == []
    assert unknown <= {f"monitoring.coreos.com/v1/{k}" for k in CR_SCHEMAS}
    for m in out.manifests:
        if m["kind"] in CR_SCHEMAS:
            jsonschema.validate(m, CR_SCHEMAS[m["kind"]])
        assert m["metadata"]["labels"]["app.kubernetes.io/managed-by"] == "Helm"
        assert len(m["metadata"]["name"]) <= 63
    if mode == "sidecar-only":  # the pieces to merge are containers and volumes that validate once merged
        data = pod_patch(out)
        for key in ("agent-container.yaml", "agent-sidecar.yaml", "volumes.yaml", "vllm-env.yaml"):
            assert isinstance(yaml.safe_load(data[key]), list), key
    kinds = {m["kind"] for m in out.manifests}
    assert ("Deployment" in kinds) == (mode == "deploy")


def test_monitors_scrape_agent_and_vllm_with_the_token(renderer: Path) -> None:
    out = render(renderer, "deploy", [], values="token-secret")
    svc = next(s for s in out.of_kind("Service") if s["metadata"]["name"].endswith("-metrics"))
    sm, pm = out.one("ServiceMonitor"), out.one("PodMonitor")
    assert {p["name"] for p in svc["spec"]["ports"]} == {"attrib-http", "vllm-http"}
    assert sm["spec"]["selector"]["matchLabels"].items() <= svc["metadata"]["labels"].items()
    assert not sm["spec"]["selector"]["matchLabels"].items() <= out.one("Deployment")["metadata"]["labels"].items()
    for endpoints in (sm["spec"]["endpoints"], pm["spec"]["podMetricsEndpoints"]):
        agent = next(e for e in endpoints if e["port"] == "attrib-http")
        assert agent["authorization"]["credentials"] == {"name": "attrib-token", "key": "token"}
        assert any(e["port"] in ("vllm-http", "http") and "authorization" not in e for e in endpoints)


@pytest.mark.parametrize("mode", sorted(MODES))
def test_native_sidecar_from_kubernetes_1_29(renderer: Path, mode: str) -> None:
    for kube, native in (("1.28", False), ("1.29", True), ("1.33", True)):
        spec = pod_spec(render(renderer, mode, [], kube), mode)
        init = containers_named(spec, "initContainers", "attrib-agent")
        plain = containers_named(spec, "containers", "attrib-agent")
        if native:
            assert len(init) == 1 and not plain and init[0]["restartPolicy"] == "Always"
        else:
            assert len(plain) == 1 and not init and "restartPolicy" not in plain[0]
    forced = pod_spec(render(renderer, mode, ["agent.nativeSidecar=false"], "1.33"), mode)
    assert containers_named(forced, "containers", "attrib-agent")
    forced = pod_spec(render(renderer, mode, ["agent.nativeSidecar=true"], "1.28"), mode)
    assert containers_named(forced, "initContainers", "attrib-agent")


def test_agent_never_decides_whether_vllm_serves(renderer: Path) -> None:
    selectors = set()
    for kube in KUBE_VERSIONS:
        for values in VALUE_SETS:
            out = render(renderer, "deploy", [], kube, values)
            dep = out.one("Deployment")
            svc = next(s for s in out.of_kind("Service") if s["metadata"]["name"] == dep["metadata"]["name"])
            selector = svc["spec"]["selector"]
            selectors.add(json.dumps(selector, sort_keys=True))
            assert selector == dep["spec"]["selector"]["matchLabels"]
            assert selector.items() <= dep["spec"]["template"]["metadata"]["labels"].items()
            assert svc["spec"]["ports"] == [{"name": "http", "port": 8000, "targetPort": "http", "protocol": "TCP"}]
            spec = dep["spec"]["template"]["spec"]
            vllm = containers_named(spec, "containers", "vllm")[0]
            assert [p["name"] for p in vllm["ports"]] == ["http"] and "readinessProbe" in vllm
            agent = (containers_named(spec, "initContainers", "attrib-agent")
                     + containers_named(spec, "containers", "attrib-agent"))[0]
            assert "readinessProbe" not in agent and agent["livenessProbe"]["httpGet"]["path"] == "/healthz"
    assert selectors == {json.dumps({"app.kubernetes.io/instance": "test", "app.kubernetes.io/name": "attrib-agent"},
                                    sort_keys=True)}
    with pytest.raises(cc.ChartError, match="readinessProbe' was unexpected"):
        render(renderer, "deploy", ["agent.readinessProbe.httpGet.path=/readyz"])


@pytest.mark.parametrize(("mode", "sets", "message"), [
    ("deploy", ["vllm.model="], r"execution error at \(attrib-agent/templates/.*: vllm.model is required in deploy"),
    ("sidecar-only", ["sidecar.podSelector=null"], "sidecar.podSelector is required in sidecar-only mode"),
    ("sidecar-only", ["sidecar.deploymentName="], "sidecar.deploymentName is required in sidecar-only mode"),
    ("sidecar-only", ["sidecar.vllmChart.releaseName=myvllm"], "sidecar.vllmChart.command is required"),
    ("deploy", ["agent.apiToken.value=a", "agent.apiToken.existingSecret=b"], "set existingSecret or value, not both"),
    ("deploy", ["mode=both"], r"- mode: 'both' is not one of \['deploy', 'sidecar-only'\]"),
    ("deploy", ["vllm.logging.backupCount=0"], "vllm/logging/backupCount: 0 is less than the minimum of 1"),
    ("deploy", ["agent.otlp.forward=otel:4317"], "agent/otlp/forward: 'otel:4317' does not match"),
    ("deploy", ["agent.port=port"], "agent/port: 'port' is not of type 'integer'"),
])
def test_wrong_values_give_clear_errors(renderer: Path, mode: str, sets: list[str], message: str) -> None:
    with pytest.raises(cc.ChartError, match=message):
        render(renderer, mode, sets)


def test_chart_needs_kubernetes_1_25(renderer: Path) -> None:
    with pytest.raises(cc.ChartError, match="chart requires kubeVersion: >=1.25.0-0 which is incompatible with "
                                            "Kubernetes v1.24.0"):
        render(renderer, "deploy", [], "1.24")


def test_vllm_is_configured_for_the_agent(renderer: Path) -> None:
    out = render(renderer, "deploy", ["vllm.servedModelName=qwen", "vllm.extraArgs={--max-model-len,8192}"])
    spec = out.one("Deployment")["spec"]["template"]["spec"]
    vllm = containers_named(spec, "containers", "vllm")[0]
    agent = containers_named(spec, "initContainers", "attrib-agent")[0]
    args = vllm["args"]
    assert args[0] == "Qwen/Qwen2.5-1.5B-Instruct" and args[-2:] == ["--max-model-len", "8192"]
    assert {"--enable-log-requests", "--enable-logging-iteration-details"} <= set(args)
    endpoint = args[args.index("--otlp-traces-endpoint") + 1]
    env = {e["name"]: e.get("value") for e in vllm["env"]}
    assert endpoint == f"http://127.0.0.1:{agent['args'][agent['args'].index('--otlp-grpc-port') + 1]}"
    assert env["OTEL_EXPORTER_OTLP_TRACES_PROTOCOL"] == "grpc" and env["TZ"] == "UTC"
    # the logging config is the mounted ConfigMap's file, and vLLM's log dir is the agent's --log-file dir
    config_path = Path(env["VLLM_LOGGING_CONFIG_PATH"])
    mounts = {m["name"]: m for m in vllm["volumeMounts"]}
    volumes = {v["name"]: v for v in spec["volumes"]}
    cm_name = volumes[mounts["vllm-logging-config"]["name"]]["configMap"]["name"]
    assert config_path.parent == Path(mounts["vllm-logging-config"]["mountPath"])
    config = json.loads(next(m for m in out.of_kind("ConfigMap") if m["metadata"]["name"] == cm_name)["data"][
        config_path.name])
    log_file = Path(config["handlers"]["attrib_file"]["filename"])
    assert agent["args"][agent["args"].index("--log-file") + 1] == str(log_file)
    agent_mounts = {m["name"]: m for m in agent["volumeMounts"]}
    assert log_file.parent == Path(mounts["vllm-logs"]["mountPath"]) == Path(agent_mounts["vllm-logs"]["mountPath"])
    assert agent_mounts["vllm-logs"]["readOnly"] is True
    handlers = config["handlers"]["attrib_file"]
    size_limit = int(volumes["vllm-logs"]["emptyDir"]["sizeLimit"].removesuffix("Mi")) * 2**20
    assert handlers["maxBytes"] * (handlers["backupCount"] + 1) < size_limit
    assert spec["enableServiceLinks"] is False  # a Service named vllm would set VLLM_PORT=tcp://... otherwise
    sc = agent["securityContext"]
    assert sc["runAsNonRoot"] and sc["readOnlyRootFilesystem"] and sc["capabilities"]["drop"] == ["ALL"]
    assert sc["allowPrivilegeEscalation"] is False and sc["seccompProfile"]["type"] == "RuntimeDefault"


def test_vllm_0_32_accepts_the_flags(renderer: Path) -> None:
    """vLLM's own argument parser (its `serve` flags) on the chart's args; slow: it imports vLLM (~10 s)."""
    if importlib.util.find_spec("vllm") is None:
        pytest.skip("vllm is not installed (pip install 'attrib-agent[lab]')")
    vllm = containers_named(pod_spec(render(renderer, "deploy", []), "deploy"), "containers", "vllm")[0]
    model, *flags = vllm["args"]
    script = ("import json, sys\n"
              "from vllm.entrypoints.launchers.cli_args import make_arg_parser\n"
              "from vllm.utils.argparse_utils import FlexibleArgumentParser\n"
              "a = make_arg_parser(FlexibleArgumentParser()).parse_args(sys.argv[1:])\n"
              "print(json.dumps([a.model, a.enable_log_requests, a.enable_logging_iteration_details, "
              "a.otlp_traces_endpoint, a.port]))\n")
    proc = subprocess.run([sys.executable, "-c", script, "--model", model, *flags], capture_output=True, text=True,
                          timeout=120, env={"VLLM_TARGET_DEVICE": "cpu", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == [model, True, True, "http://127.0.0.1:4317", 8000]


def test_the_agent_accepts_its_args(renderer: Path) -> None:
    from attrib_agent.cli import build_parser
    from attrib_agent.config.load import load_config

    out = render(renderer, "deploy", [], values="forward-journal")
    agent = containers_named(pod_spec(out, "deploy"), "initContainers", "attrib-agent")[0]
    env = {e["name"]: e.get("value", "from-the-downward-api-or-a-secret") for e in agent["env"]}
    assert agent["command"] == ["attrib-agent"]
    cfg = load_config(build_parser().parse_args(agent["args"]), env)
    assert (cfg.vllm_url, str(cfg.log_file), str(cfg.listen)) == ("http://127.0.0.1:8000", "/var/log/vllm/vllm.log",
                                                                  "0.0.0.0:9400")
    assert (cfg.otlp_grpc_port, cfg.otlp_http_port, cfg.otlp_bind) == (4317, 4318, "127.0.0.1")
    assert cfg.otlp_forward is not None and cfg.otlp_forward.url.startswith("grpc://otel-collector.obs:4317")
    assert cfg.nvml is True and str(cfg.journal_dir) == "/var/lib/attrib-agent"
    assert str(cfg.state_dir) == "/var/lib/attrib-agent-state"  # the fit kept across restarts (on by default)
    assert cfg.api_token is not None and env["NVIDIA_VISIBLE_DEVICES"] == "all"
    assert cfg.warnings == ()  # e.g. no "environment variable ... is not a setting"
    assert "--no-nvml" in containers_named(pod_spec(render(renderer, "deploy", []), "deploy"), "initContainers",
                                           "attrib-agent")[0]["args"]


@pytest.mark.parametrize("form", [["--max-num-batched-tokens", "8192"], ["--max-num-batched-tokens=8192"]])
def test_the_agent_is_given_the_step_budget_vllm_is(renderer: Path, form: list[str]) -> None:
    """vLLM logs its budget once, at start; a sidecar restarted while vLLM runs starts at its log's end, so the chart
    passes the budget vllm.extraArgs sets (in either of argparse's forms), and none when it sets none."""
    from attrib_agent.cli import build_parser
    from attrib_agent.config.load import load_config

    sets = [f"vllm.extraArgs={{{','.join(form)}}}"]
    agent = containers_named(pod_spec(render(renderer, "deploy", sets), "deploy"), "initContainers", "attrib-agent")[0]
    assert load_config(build_parser().parse_args(agent["args"]), {}).token_budget == 8192
    plain = containers_named(pod_spec(render(renderer, "deploy", []), "deploy"), "initContainers", "attrib-agent")[0]
    assert "--token-budget" not in plain["args"]


def test_chart_copies_equal_the_generated_files(renderer: Path) -> None:
    assert cc.chart_file_drift() == [], "run: python tools/helm_render/chart_check.py --sync-files"
    out = render(renderer, "deploy", ["dashboards.label=grafana_dash", "dashboards.annotations.grafana_folder=vLLM"],
                 values="monitors")
    boards = [m for m in out.of_kind("ConfigMap") if m["metadata"]["labels"].get("grafana_dash") == "1"]
    originals = sorted((REPO / "dashboards" / "json").glob("*.json"))
    assert len(boards) == len(originals) >= 1
    for board, original in zip(sorted(boards, key=lambda b: next(iter(b["data"]))), originals, strict=True):
        assert board["data"] == {original.name: original.read_text().rstrip("\n")}
        assert board["metadata"]["annotations"] == {"grafana_folder": "vLLM"}
    rules = yaml.safe_load((REPO / "dashboards" / "rules" / "attrib-agent.rules.yml").read_text())
    assert out.one("PrometheusRule")["spec"]["groups"] == rules["groups"]


def test_prometheus_rule_passes_promtool(renderer: Path, tmp_path: Path) -> None:
    if shutil.which("promtool") is None:
        pytest.skip("promtool is not installed: run scripts/setup-system.sh")
    rule = render(renderer, "deploy", [], values="monitors").one("PrometheusRule")
    path = tmp_path / "rules.yml"
    path.write_text(yaml.safe_dump({"groups": rule["spec"]["groups"]}))
    proc = subprocess.run(["promtool", "check", "rules", str(path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr
