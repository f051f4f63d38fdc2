"""The chart's pieces meet the real tools that consume them: vLLM's logging (dictConfig with vLLM's own
formatter) writing lines the agent's parser reads, kustomize merging the sidecar-only patch into a Deployment
shaped like production-stack's, and the values for vLLM's example chart, whose shell wrapper is run for real.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import chart_check  # tools/helm_render/chart_check.py, put on sys.path by conftest.py
import pytest
import yaml  # type: ignore[import-untyped]

from attrib_agent.health import SourceHealth
from attrib_agent.lab.server import LOG_DATEFMT, LOG_FORMAT
from attrib_agent.recording import LOG, Recording
from attrib_agent.sources.log.parser import LogLineParser

REPO = Path(__file__).resolve().parents[2]
RECORDING = REPO / "tests" / "fixtures" / "recordings" / "preempt"
SIDECAR = ["mode=sidecar-only", r"sidecar.podSelector.app\.kubernetes\.io/name=vllm",
           "sidecar.deploymentName=vllm-llama3-deployment-vllm"]
# Which logger writes each file's lines in vLLM 0.32 (logger = init_logger(__name__) in each module).
FILE_LOGGERS = {"loggers.py": "vllm.v1.metrics.loggers", "async_llm.py": "vllm.v1.engine.async_llm",
                "request_logger.py": "vllm.entrypoints.serve.utils.request_logger"}
PREFIX_END = re.compile(r"\[(?P<file>[^\]\s]+):\d+\] ")
MS_STAMP = re.compile(r"^\(APIServer pid=\d+\) INFO \d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3} \[")

# Runs vLLM's logging config as vLLM would: stdlib dictConfig, vLLM's NewLineFormatter (loaded from its file,
# as importing the vllm package would load torch) and the record attribute vLLM's record factory adds.
APPLY_CONFIG = r"""
import importlib.util, json, logging, logging.config, sys, types
formatter_py, config_path, messages_path = sys.argv[1:4]
spec = importlib.util.spec_from_file_location("vllm.logging_utils.formatter", formatter_py)
mod = importlib.util.module_from_spec(spec)
spec.loader.exec_module(mod)
pkg, utils = types.ModuleType("vllm"), types.ModuleType("vllm.logging_utils")
pkg.__path__, pkg.logging_utils, utils.NewLineFormatter = [], utils, mod.NewLineFormatter
sys.modules.update({"vllm": pkg, "vllm.logging_utils": utils})
base = logging.getLogRecordFactory()
def factory(*args, **kwargs):
    record = base(*args, **kwargs)
    record.vllm_process_name = "APIServer"
    return record
logging.setLogRecordFactory(factory)
logging.config.dictConfig(json.load(open(config_path)))
for name, message in json.load(open(messages_path)):
    logging.getLogger(name).info("%s", message)
"""


cc = chart_check


def pod_patch(out: Any) -> dict[str, str]:
    return next(  # type: ignore[no-any-return]
        m for m in out.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-pod-patch"))["data"]


def logging_config(out: Any) -> dict[str, Any]:
    cm = next(m for m in out.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-vllm-logging"))
    return json.loads(cm["data"]["vllm-logging.json"])  # type: ignore[no-any-return]


def _without_times(events: list[Any]) -> list[Any]:
    return [dataclasses.replace(e, ts=0.0, log_ts=None) for e in events]


def test_logging_config_writes_what_the_agent_reads(renderer: Path, tmp_path: Path) -> None:
    vllm_spec = importlib.util.find_spec("vllm")
    formatter_py = Path(vllm_spec.origin or "").parent / "logging_utils" / "formatter.py" if vllm_spec else None
    if formatter_py is None or not formatter_py.exists():
        pytest.skip("vllm is not installed (pip install 'attrib-agent[lab]')")
    config = logging_config(cc.render(renderer, sets=["vllm.model=m"]))
    assert config["formatters"]["vllm_ms"]["format"] == LOG_FORMAT  # the lab's, which the recordings use
    assert config["formatters"]["vllm_ms"]["datefmt"] == LOG_DATEFMT
    config["handlers"]["attrib_file"]["filename"] = str(tmp_path / "vllm.log")
    recorded = [r["line"] for r in Recording(RECORDING).records(LOG)]
    messages: list[tuple[str, str]] = []
    originals: list[str] = []
    for line in recorded:
        m = PREFIX_END.search(line)
        if m and m.group("file") in FILE_LOGGERS and len(originals) < 300:
            messages.append((FILE_LOGGERS[m.group("file")], line[m.end():]))
            originals.append(line)
    messages.append(("vllm.v1.core.sched.scheduler", "a line from a logger the agent does not need"))
    (tmp_path / "config.json").write_text(json.dumps(config))
    (tmp_path / "messages.json").write_text(json.dumps(messages))
    start = time.time()
    proc = subprocess.run([sys.executable, "-c", APPLY_CONFIG, str(formatter_py), str(tmp_path / "config.json"),
                           str(tmp_path / "messages.json")], capture_output=True, text=True, timeout=60,
                          env={"TZ": "UTC", "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    written = (tmp_path / "vllm.log").read_text().splitlines()
    assert len(written) == len(originals) and len(proc.stdout.splitlines()) == len(messages)
    assert all(MS_STAMP.match(line) for line in written)
    assert "does not need" not in "\n".join(written) and "does not need" in proc.stdout
    from_file, from_recording = LogLineParser(SourceHealth("vllm_log")), LogLineParser(SourceHealth("vllm_log"))
    got = [e for line in written for e in from_file.parse_all(line, time.time())]
    want = [e for line in originals for e in from_recording.parse_all(line, 0.0)]
    assert {type(e).__name__ for e in want} >= {"EngineStep", "RequestReceived", "RequestAdded"}
    assert _without_times(got) == _without_times(want)
    assert all(e.log_ts is not None and start - 2 < e.log_ts < time.time() + 2 for e in got)  # read as UTC, to ms


def production_stack_deployment(extra_args: list[str]) -> dict[str, Any]:
    """A Deployment shaped as production-stack's deployment-vllm-multi.yaml renders one model."""
    labels = {"model": "llama3", "helm-release-name": "vllm", "environment": "router", "release": "router"}
    vllm = {"name": "vllm", "image": "vllm/vllm-openai:v0.32.0", "imagePullPolicy": "Always",
            "command": ["vllm", "serve", "meta-llama/Llama-3.1-8B-Instruct", "--host", "0.0.0.0", "--port", "8000",
                        *extra_args],
            "env": [{"name": "PYTHONHASHSEED", "value": "123"}, {"name": "HF_HOME", "value": "/data"}],
            "ports": [{"name": "container-port", "containerPort": 8000}],
            "resources": {"limits": {"nvidia.com/gpu": 1}},
            "volumeMounts": [{"name": "vllm-storage", "mountPath": "/data"}]}
    return {"apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": "vllm-llama3-deployment-vllm", "namespace": "default", "labels": labels},
            "spec": {"replicas": 1, "selector": {"matchLabels": labels}, "template": {
                "metadata": {"labels": labels},
                "spec": {"containers": [vllm], "volumes": [{"name": "vllm-storage", "persistentVolumeClaim": {
                    "claimName": "vllm-llama3-storage-claim"}}]}}}}


@pytest.mark.parametrize(("kube", "exact"), [("1.28", False), ("1.33", False), ("1.33", True)])
def test_kustomize_merges_the_patch_into_production_stack(renderer: Path, tmp_path: Path, kube: str,
                                                          exact: bool) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (for its built-in kustomize) is not installed: scripts/setup-system.sh installs it "
                    "where an apt source offers it")
    data = pod_patch(cc.render(renderer, kube_version=kube, sets=[*SIDECAR, f"exactMode.enabled={exact}"]))
    vllm_args = yaml.safe_load(data["vllm-args.yaml"])  # production-stack: vllmConfig.extraArgs
    (tmp_path / "deployment.yaml").write_text(yaml.safe_dump(production_stack_deployment(vllm_args)))
    (tmp_path / "attrib-agent-patch.yaml").write_text(data["kustomize-patch.yaml"])
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": ["deployment.yaml"], "patches": [{"path": "attrib-agent-patch.yaml"}]}))
    proc = subprocess.run([kubectl, "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    merged = yaml.safe_load(proc.stdout)
    errors, _ = cc.validate_manifests([merged], sorted({kube, "1.29", "1.33"}))
    assert errors == []
    spec = merged["spec"]["template"]["spec"]
    agent_in = "initContainers" if kube == "1.33" else "containers"
    assert [c["name"] for c in spec[agent_in] if c["name"] == "attrib-agent"] == ["attrib-agent"]
    vllm = next(c for c in spec["containers"] if c["name"] == "vllm")
    assert {"PYTHONHASHSEED", "HF_HOME", "VLLM_LOGGING_CONFIG_PATH", "TZ"} <= {e["name"] for e in vllm["env"]}
    assert {"/data", "/var/log/vllm", "/etc/attrib-agent"} <= {m["mountPath"] for m in vllm["volumeMounts"]}
    assert {"vllm-storage", "vllm-logs", "vllm-logging-config"} <= {v["name"] for v in spec["volumes"]}
    assert "--enable-logging-iteration-details" in vllm["command"] and vllm["image"] == "vllm/vllm-openai:v0.32.0"
    if exact:  # the plugin's installer runs first, and vLLM keeps production-stack's env beside the plugin's
        assert [c["name"] for c in spec["initContainers"]] == ["attrib-plugin-install", "attrib-agent"]
        env = {e["name"]: e.get("value") for e in vllm["env"]}
        assert env["ATTRIB_PLUGIN_SOCKET"] == "/var/run/attrib/plugin.sock" and env["HF_HOME"] == "/data"
        assert {"attrib-plugin", "attrib-plugin-socket"} <= {v["name"] for v in spec["volumes"]}
    else:
        assert "ATTRIB_PLUGIN_SOCKET" not in {e["name"] for e in vllm["env"]}


def test_values_for_vllms_example_chart(renderer: Path, tmp_path: Path) -> None:
    command = ["vllm", "serve", "/data/", "--served-model-name", "opt-125m", "--dtype", "bfloat16"]
    out = cc.render(renderer, kube_version="1.29", sets=[*SIDECAR, "sidecar.vllmChart.releaseName=myvllm"],
                    set_strings=[f"sidecar.vllmChart.command={{{','.join(command)}}}"])
    values = yaml.safe_load(pod_patch(out)["vllm-chart-values.yaml"])
    image, extra = values["image"], values["extraContainers"]
    # The pod as that chart's templates/deployment.yaml builds it: vllm (image.command, image.env, the model
    # PVC at /data), then extraContainers; its only volume is <release>-storage.
    vllm = {"name": "vllm", "image": "vllm/vllm-openai:latest", "command": image["command"], "env": image["env"],
            "ports": [{"name": "http", "containerPort": 8000}],
            "volumeMounts": [{"name": "myvllm-storage", "mountPath": "/data"}]}
    dep = {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "myvllm-deployment-vllm"},
           "spec": {"selector": {"matchLabels": {"release": "test"}}, "template": {
               "metadata": {"labels": {"release": "test"}},
               "spec": {"containers": [vllm, *extra], "volumes": [
                   {"name": "myvllm-storage", "persistentVolumeClaim": {"claimName": "myvllm-storage-claim"}}]}}}}
    errors, _ = cc.validate_manifests([dep], ["1.29", "1.33"])
    assert errors == []
    assert [m["name"] for m in extra[0]["volumeMounts"]] == ["myvllm-storage"]
    assert "/data/attrib-agent/vllm.log" in extra[0]["args"]
    # Run the wrapper for real: /data moved under tmp_path, and a Python stand-in for `vllm serve`.
    data = tmp_path / "data"
    shell, flag, script, name, *exec_args = image["command"]
    assert exec_args[:len(command)] == command
    env = {e["name"]: e["value"] for e in image["env"] if "value" in e}
    env["VLLM_LOGGING_CONFIG_PATH"] = env["VLLM_LOGGING_CONFIG_PATH"].replace("/data/", f"{data}/")
    stand_in = [sys.executable, "-c", "import json, os, sys; c = json.load(open(os.environ["
                "'VLLM_LOGGING_CONFIG_PATH'])); print(json.dumps([c['handlers']['attrib_file']['filename'], "
                "c['formatters']['vllm_ms']['format'], sys.argv[1:]]))"]
    proc = subprocess.run([shell, flag, script.replace("/data/", f"{data}/"), name, *stand_in, *exec_args[2:]],
                          capture_output=True, text=True, timeout=30, env=env | {"PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr
    filename, fmt, argv = json.loads(proc.stdout)
    assert filename == "/data/attrib-agent/vllm.log" and fmt == LOG_FORMAT
    assert argv == [*command[2:], *yaml.safe_load(pod_patch(out)["vllm-args.yaml"])]
