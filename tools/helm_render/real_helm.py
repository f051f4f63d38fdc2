"""Real Helm for the chart: `helm lint` and `helm package` by Helm v4's own Go library (PyPI's helm-sdkpy).

helm-sdkpy needs Python >= 3.12 and the project runs on 3.11, so scripts/setup-helm-venv.sh makes .venv-helm
and each call runs helm_sdk_call.py there in a subprocess. helm-sdkpy's lint takes no values, so a values set
is linted as a copy of the chart whose values.yaml is the chart's defaults coalesced with the set, as
`helm lint -f set.yaml` would coalesce them. It has no client-only render (install needs a cluster):
rendering stays with helm-render beside this file.

    python tools/helm_render/real_helm.py lint [-f values.yaml ...]   # the chart, or it with values files
    python tools/helm_render/real_helm.py package DEST
"""

from __future__ import annotations

import argparse
import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHART = REPO / "helm" / "attrib-agent"
HELM_VENV = REPO / ".venv-helm"
CALL = HERE / "helm_sdk_call.py"
CALL_TIMEOUT_S = 120
SEVERITIES = {0: "unknown", 1: "info", 2: "warning", 3: "error"}  # Helm's pkg/chart/v2/lint/support
# Lint renders leniently: a `required` value missing or a `fail` reached is only logged, not a lint message.
# real_helm counts both as failures (`helm template` and `helm install` stop on them).
LOGGED_FAILURE = re.compile(r'(?:missing required values|funcMap fail) message="((?:[^"\\]|\\.)*)"')


class HelmUnavailable(Exception):
    """.venv-helm is missing or cannot load Helm: the message says how to make it."""


class HelmError(Exception):
    """Helm refused the action (e.g. package of a directory that is not a chart): Helm's message."""


@dataclass(frozen=True)
class LintMessage:
    severity: str  # info | warning | error (helm-sdkpy drops the message text: Go errors marshal as {})
    path: str  # the chart file the message is about, e.g. templates/deployment.yaml


@dataclass(frozen=True)
class LintResult:
    messages: tuple[LintMessage, ...]
    errors: int  # Helm's LintResult.Errors: failures that stopped linting (e.g. no Chart.yaml)
    logged_failures: tuple[str, ...]  # `required` and `fail` messages lint mode only logged
    log: str  # what Helm logged (stderr), for a failing test's message

    @property
    def clean(self) -> bool:
        """As `helm lint --strict` would pass it, and no `required` or `fail` hit: only info messages."""
        return (self.errors == 0 and not self.logged_failures
                and all(m.severity == "info" for m in self.messages))

    def at(self, severity: str) -> list[str]:
        return [m.path for m in self.messages if m.severity == severity]


def helm_python() -> Path:
    python = HELM_VENV / "bin" / "python"
    if not python.exists():
        raise HelmUnavailable(f"{HELM_VENV} is missing: run scripts/setup-helm-venv.sh (needs a Python 3.12)")
    return python


def _call(*args: str) -> tuple[dict[str, Any], str]:
    proc = subprocess.run([str(helm_python()), str(CALL), *args], capture_output=True, text=True,
                          timeout=CALL_TIMEOUT_S, cwd=REPO)
    try:
        out = json.loads(proc.stdout)
    except json.JSONDecodeError:
        raise HelmUnavailable(f"helm-sdkpy did not answer ({proc.returncode}): {proc.stderr[-2000:]}") from None
    if "error" in out:
        raise HelmError(out["error"])
    return out, proc.stderr


def version() -> str:
    return str(_call("version")[0]["version"])


def coalesce(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """Helm's coalescing of user values over a chart's: maps merge key by key, anything else replaces, and a
    null deletes the chart's key."""
    out = copy.deepcopy(dict(base))
    for key, value in override.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, Mapping) and isinstance(out.get(key), Mapping):
            out[key] = coalesce(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def chart_values(chart: Path = CHART) -> dict[str, Any]:
    return yaml.safe_load((chart / "values.yaml").read_text()) or {}


def lint(chart: Path = CHART, values: Sequence[Mapping[str, Any]] = ()) -> LintResult:
    """`helm lint CHART -f v1 -f v2 ...` with each values mapping in order (none: the chart's defaults)."""
    if not values:
        return _lint(chart)
    merged = chart_values(chart)
    for v in values:
        merged = coalesce(merged, v)
    with tempfile.TemporaryDirectory(prefix="attrib-lint-") as tmp:
        copy_dir = Path(tmp) / chart.name
        shutil.copytree(chart, copy_dir)
        (copy_dir / "values.yaml").write_text(yaml.safe_dump(merged, sort_keys=False))
        return _lint(copy_dir)


def _lint(chart: Path) -> LintResult:
    out, log = _call("lint", str(chart))
    result = out["lint"]
    messages = tuple(LintMessage(SEVERITIES.get(m["Severity"], str(m["Severity"])), m["Path"])
                     for m in result.get("Messages") or [])
    failures = tuple(_unquote(m) for m in LOGGED_FAILURE.findall(log))
    return LintResult(messages, len(result.get("Errors") or []), tuple(dict.fromkeys(failures)), log)


def _unquote(text: str) -> str:
    """A Go-quoted log value's text (its escapes are JSON's for what a chart's message holds)."""
    try:
        return str(json.loads(f'"{text}"'))
    except json.JSONDecodeError:
        return text


def package(dest: Path, chart: Path = CHART) -> Path:
    """`helm package CHART -d DEST`: the archive's path."""
    dest.mkdir(parents=True, exist_ok=True)
    return Path(_call("package", str(chart), str(dest))[0]["package"])


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("verb", choices=["lint", "package"])
    p.add_argument("dest", nargs="?", type=Path, help="package: the directory for the .tgz")
    p.add_argument("-f", "--values", action="append", default=[], type=Path)
    args = p.parse_args(argv)
    if args.verb == "package":
        print(package(args.dest or Path.cwd()))
        return 0
    result = lint(CHART, [yaml.safe_load(f.read_text()) or {} for f in args.values])
    for m in result.messages:
        print(f"[{m.severity.upper()}] {m.path}")
    for message in result.logged_failures:
        print(f"[ERROR] {message}")
    print(f"{'clean' if result.clean else 'NOT clean'}: {len(result.messages)} messages, {result.errors} errors")
    return 0 if result.clean else 1


if __name__ == "__main__":
    sys.exit(main())
