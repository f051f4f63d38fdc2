"""The chart's exact mode (exactMode.*, off by default): vLLM gets the plugin (an init container pip-installs it
onto vLLM's PYTHONPATH, or it is in the image) and ATTRIB_PLUGIN_SOCKET, a unix socket on an emptyDir the
agent mounts too. The install command is run for real and vLLM's own plugin loader finds what it installed.
"""

from __future__ import annotations

import base64
import hashlib
import json
import subprocess
import sys
import zipfile
from pathlib import Path
from typing import Any

import chart_check  # tools/helm_render/, put on sys.path by conftest.py
import pytest
import yaml  # type: ignore[import-untyped]
from chart_values import MODES, VALUE_SETS, merged, values_file

SOCKET = "/var/run/attrib/plugin.sock"


def render(renderer: Path, mode: str, values: str, kube: str = "1.33", extra: dict[str, Any] | None = None) -> Any:
    files = [values_file(merged(MODES[mode], VALUE_SETS[values], extra or {}))]
    return chart_check.render(renderer, kube_version=kube, values_files=files)


def pod_spec(out: Any, mode: str) -> dict[str, Any]:
    if mode == "deploy":
        return out.one("Deployment")["spec"]["template"]["spec"]  # type: ignore[no-any-return]
    patch = next(m for m in out.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-pod-patch"))["data"]
    return yaml.safe_load(patch["kustomize-patch.yaml"])["spec"]["template"]["spec"]  # type: ignore[no-any-return]


def container(spec: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in spec.get("initContainers", []) + spec["containers"] if c["name"] == name)


def env_of(c: dict[str, Any]) -> dict[str, str]:
    return {e["name"]: e.get("value", "") for e in c.get("env", [])}


def mounts_of(c: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {m["name"]: m for m in c.get("volumeMounts", [])}


@pytest.mark.parametrize("mode", sorted(MODES))
def test_off_by_default(renderer: Path, mode: str) -> None:
    out = render(renderer, mode, "defaults")
    assert "attrib-plugin" not in out.text and "ATTRIB_PLUGIN_SOCKET" not in out.text
    assert "--plugin-socket" not in out.text
    assert out.values["exactMode"]["enabled"] is False


@pytest.mark.parametrize("kube", ["1.28", "1.33"])
@pytest.mark.parametrize("mode", sorted(MODES))
def test_plugin_install_and_socket_are_wired(renderer: Path, mode: str, kube: str) -> None:
    out = render(renderer, mode, "exact-mode", kube)
    spec = pod_spec(out, mode)
    vllm_name = "vllm" if mode == "deploy" else out.values["sidecar"]["vllmContainerName"]
    vllm, agent = container(spec, vllm_name), container(spec, "attrib-agent")
    installer = spec["initContainers"][0]  # first: vLLM and the agent start after it
    assert installer["name"] == "attrib-plugin-install"
    assert installer["command"] == ["python3", "-m", "pip", "install", "--no-cache-dir", "--no-deps",
                                    "--disable-pip-version-check", "--target", "/opt/attrib-plugin",
                                    "attrib-agent-vllm-plugin"]
    assert installer["image"] == "vllm/vllm-openai:v0.32.0"  # vLLM's own Python installs it
    assert mounts_of(installer)["attrib-plugin"]["mountPath"] == "/opt/attrib-plugin"
    env = env_of(vllm)
    assert env["ATTRIB_PLUGIN_SOCKET"] == SOCKET and env["PYTHONPATH"] == "/opt/attrib-plugin"
    assert mounts_of(vllm)["attrib-plugin"] == {"name": "attrib-plugin", "mountPath": "/opt/attrib-plugin",
                                                "readOnly": True}
    # vLLM and the agent share the socket's directory; the agent (non-root, read-only root fs) can create it.
    assert mounts_of(vllm)["attrib-plugin-socket"]["mountPath"] == str(Path(SOCKET).parent)
    assert mounts_of(agent)["attrib-plugin-socket"] == {"name": "attrib-plugin-socket",
                                                         "mountPath": str(Path(SOCKET).parent)}
    # ... and the agent binds it: exact mode on both sides (docs/exact-mode.md)
    args = agent["args"]
    assert args[args.index("--plugin-socket") + 1] == SOCKET
    volumes = {v["name"]: v for v in spec["volumes"]}
    assert "emptyDir" in volumes["attrib-plugin-socket"] and "emptyDir" in volumes["attrib-plugin"]
    errors, _ = chart_check.validate_manifests(out.manifests, [kube])
    assert errors == []
    if mode == "sidecar-only":  # the piece on its own, for charts that take init containers as a list
        data = next(m for m in out.of_kind("ConfigMap") if m["metadata"]["name"].endswith("-pod-patch"))["data"]
        assert yaml.safe_load(data["plugin-installer.yaml"]) == [installer]
        assert SOCKET in data["vllm-env.yaml"]


@pytest.mark.parametrize("mode", sorted(MODES))
def test_plugin_baked_into_the_image(renderer: Path, mode: str) -> None:
    spec = pod_spec(render(renderer, mode, "exact-mode-image"), mode)
    names = [c["name"] for c in spec.get("initContainers", []) + spec["containers"]]
    assert "attrib-plugin-install" not in names
    vllm = container(spec, "vllm")
    assert env_of(vllm)["ATTRIB_PLUGIN_SOCKET"] == SOCKET and "PYTHONPATH" not in env_of(vllm)
    assert "attrib-plugin" not in mounts_of(vllm) and "attrib-plugin-socket" in mounts_of(vllm)


def test_installer_settings(renderer: Path) -> None:
    extra = {"exactMode": {"package": "attrib-agent-vllm-plugin==0.1.0", "pipArgs": ["--index-url", "https://pi"],
                           "installerImage": {"repository": "python", "tag": "3.12-slim"},
                           "socketDir": "/run/a/", "pluginDir": "/opt/p"}}
    spec = pod_spec(render(renderer, "deploy", "exact-mode", extra=extra), "deploy")
    installer = spec["initContainers"][0]
    assert installer["image"] == "python:3.12-slim"
    assert installer["command"][-4:] == ["/opt/p", "--index-url", "https://pi", "attrib-agent-vllm-plugin==0.1.0"]
    assert env_of(container(spec, "vllm"))["ATTRIB_PLUGIN_SOCKET"] == "/run/a/plugin.sock"


def test_not_wired_into_vllms_example_chart_values(renderer: Path) -> None:
    """vLLM's example chart takes no volumes, so its values carry no socket (docs/deployment.md says so)."""
    extra = {"sidecar": {"vllmChart": {"releaseName": "myvllm", "command": ["vllm", "serve", "/data/"]}}}
    data = next(m for m in render(renderer, "sidecar-only", "exact-mode", extra=extra).of_kind("ConfigMap")
                if m["metadata"]["name"].endswith("-pod-patch"))["data"]
    assert "ATTRIB_PLUGIN_SOCKET" not in data["vllm-chart-values.yaml"] and SOCKET in data["vllm-env.yaml"]


def stand_in_wheel(where: Path) -> Path:
    """A wheel named like the plugin with a `vllm.general_plugins` entry point that reports the socket it got."""
    name, version = "attrib_agent_vllm_plugin", "0.0.1"
    dist = f"{name}-{version}.dist-info"
    files = {
        f"{name}_standin.py": "import os\n\ndef register():\n    return os.environ['ATTRIB_PLUGIN_SOCKET']\n",
        f"{dist}/METADATA": f"Metadata-Version: 2.1\nName: attrib-agent-vllm-plugin\nVersion: {version}\n",
        f"{dist}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
        f"{dist}/entry_points.txt": f"[vllm.general_plugins]\nattrib_steps = {name}_standin:register\n",
    }
    record = [f"{p},sha256={base64.urlsafe_b64encode(hashlib.sha256(t.encode()).digest()).rstrip(b'=').decode()},"
              f"{len(t.encode())}" for p, t in files.items()]
    files[f"{dist}/RECORD"] = "\n".join([*record, f"{dist}/RECORD,,"]) + "\n"
    wheel = where / f"{name}-{version}-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as z:
        for path, text in files.items():
            z.writestr(path, text)
    return wheel


def test_vllm_loads_what_the_init_container_installs(renderer: Path, tmp_path: Path) -> None:
    """The init container's command (with this Python, a local wheel and a scratch dir), then vLLM 0.32's own
    plugin loader with the rendered PYTHONPATH and ATTRIB_PLUGIN_SOCKET: it finds and calls the plugin."""
    spec = pod_spec(render(renderer, "deploy", "exact-mode"), "deploy")
    command = spec["initContainers"][0]["command"]
    target = tmp_path / "opt-attrib-plugin"
    run = [sys.executable if a == "python3" else str(target) if a == "/opt/attrib-plugin" else a
           for a in command[:-1]] + [str(stand_in_wheel(tmp_path))]
    proc = subprocess.run(run, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    env = env_of(container(spec, "vllm"))
    script = ("import json\nfrom vllm.plugins import load_plugins_by_group\n"
              "plugins = load_plugins_by_group('vllm.general_plugins')\n"
              "print(json.dumps({k: f() for k, f in plugins.items() if k == 'attrib_steps'}))\n")
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "VLLM_TARGET_DEVICE": "cpu",
                               "PYTHONPATH": env["PYTHONPATH"].replace("/opt/attrib-plugin", str(target)),
                               "ATTRIB_PLUGIN_SOCKET": env["ATTRIB_PLUGIN_SOCKET"]})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout.splitlines()[-1]) == {"attrib_steps": SOCKET}
