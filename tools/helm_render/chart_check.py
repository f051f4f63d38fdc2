"""Render the Helm chart without helm and check what comes out; a library for the tests and a command.

`helm-render` (main.go beside this file) is built from Debian's Go and Sprig packages, offline, into a cache
directory keyed by its sources. A render runs the steps `helm template` runs: the user's values are merged
and coalesced, checked against values.schema.json (helm refuses a release whose values fail it), the
templates are executed and every manifest parsed. `validate_manifests` then checks each one against the
Kubernetes OpenAPI schemas of the given versions (kubernetes-validate, strict: unknown fields are errors).

    python tools/helm_render/chart_check.py --kube-version 1.29 --set vllm.model=m   # render and check
    python tools/helm_render/chart_check.py --sync-files                             # copy dashboards/rules in
"""

from __future__ import annotations

import argparse
import filecmp
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema  # type: ignore[import-untyped]
import kubernetes_validate  # type: ignore[import-untyped]
import yaml  # type: ignore[import-untyped]

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
CHART = REPO / "helm" / "attrib-agent"
GOPATH = Path("/usr/share/gocode")  # Debian's golang-*-dev packages (Sprig 3.2.3 and its dependencies)
# The chart's own copies (so that a packaged chart is self-contained) of files generated elsewhere.
CHART_COPIES = (("dashboards/json", "*.json", "dashboards"), ("dashboards/rules", "*.rules.yml", "rules"))
RENDER_TIMEOUT_S = 60


class ChartError(Exception):
    """helm-render or the values schema refused the chart: the message is what helm would print."""


@dataclass
class Rendered:
    """One render: the manifests (parsed), where each came from, the coalesced values, and NOTES.txt."""

    manifests: list[dict[str, Any]]
    sources: list[str]
    values: dict[str, Any]
    notes: str = ""
    text: str = field(default="", repr=False)

    def of_kind(self, kind: str) -> list[dict[str, Any]]:
        return [m for m in self.manifests if m.get("kind") == kind]

    def one(self, kind: str) -> dict[str, Any]:
        found = self.of_kind(kind)
        if len(found) != 1:
            raise AssertionError(f"expected one {kind}, found {len(found)}: {[m['metadata']['name'] for m in found]}")
        return found[0]


def cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "attrib-agent" / "helm-render"


def go_env(gocache: Path) -> dict[str, str]:
    """GOPATH mode over Debian's packages: no module proxy, no network, a cache of our own."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("GO")}
    return env | {"GO111MODULE": "off", "GOPATH": str(GOPATH), "GOPROXY": "off", "GOFLAGS": "",
                  "CGO_ENABLED": "0", "GOCACHE": str(gocache), "GOTOOLCHAIN": "local"}


def build_renderer(where: Path | None = None) -> Path:
    """The helm-render binary for the current sources, built once per source digest (seconds the first time)."""
    go = shutil.which("go")
    if go is None:
        raise ChartError("go is not installed: run scripts/setup-system.sh (Debian's golang-go and "
                         "golang-github-masterminds-sprig-dev)")
    if not (GOPATH / "src/github.com/Masterminds/sprig").is_dir():
        raise ChartError(f"Sprig is not under {GOPATH}: install golang-github-masterminds-sprig-dev")
    sources = sorted(HERE.glob("*.go"))
    digest = hashlib.sha256(subprocess.run([go, "version"], capture_output=True, check=True).stdout)
    for src in sources:
        digest.update(src.name.encode() + b"\0" + src.read_bytes())
    base = where or cache_dir()
    binary = base / f"helm-render-{digest.hexdigest()[:16]}"
    if binary.exists():
        return binary
    base.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=base) as tmp:
        out = Path(tmp) / "helm-render"
        proc = subprocess.run([go, "build", "-o", str(out), "."], cwd=HERE, env=go_env(base / "gocache"),
                              capture_output=True, text=True, timeout=600)
        if proc.returncode != 0:
            raise ChartError(f"building helm-render failed:\n{proc.stderr}")
        out.replace(binary)  # atomic: a concurrent build of the same sources writes the same bytes
    return binary


def _flags(sets: Iterable[str], set_strings: Iterable[str], values_files: Iterable[Path]) -> list[str]:
    flags: list[str] = []
    for f in values_files:
        flags += ["-f", str(f)]
    for s in sets:
        flags += ["--set", s]
    for s in set_strings:
        flags += ["--set-string", s]
    return flags


def _run(binary: Path, args: Sequence[str]) -> str:
    proc = subprocess.run([str(binary), *args], capture_output=True, text=True, timeout=RENDER_TIMEOUT_S)
    if proc.returncode != 0:
        raise ChartError(proc.stderr.strip().removeprefix("Error: "))
    return proc.stdout


def schema_errors(values: dict[str, Any], chart: Path = CHART) -> list[str]:
    """values.schema.json's complaints, one line each with the path of the value (helm's wording)."""
    schema = json.loads((chart / "values.schema.json").read_text())
    validator = jsonschema.Draft7Validator(schema)
    return [f"- {'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}"
            for e in sorted(validator.iter_errors(values), key=lambda e: list(map(str, e.absolute_path)))]


def render(binary: Path, *, chart: Path = CHART, release: str = "test", namespace: str = "default",
           kube_version: str = "1.33", sets: Iterable[str] = (), set_strings: Iterable[str] = (),
           values_files: Iterable[Path] = (), api_versions: Iterable[str] = ()) -> Rendered:
    """`helm template RELEASE CHART` with these flags; raises ChartError with helm's message on refusal."""
    flags = _flags(sets, set_strings, values_files)
    values = json.loads(_run(binary, [release, str(chart), *flags, "--dump-values"]))
    errors = schema_errors(values, chart)
    if errors:
        raise ChartError("values don't meet the specifications of the schema(s) in the following chart(s):\n"
                         f"{chart.name}:\n" + "\n".join(errors))
    args = [release, str(chart), "-n", namespace, "--kube-version", kube_version, "--notes", *flags]
    for api in api_versions:
        args += ["--api-versions", api]
    text = _run(binary, args)
    body, _, notes = text.partition("\nNOTES:\n")
    manifests, sources = [], []
    for doc in body.split("\n---\n"):
        doc = doc.removeprefix("---\n")
        if not doc.strip():
            continue
        first, _, rest = doc.partition("\n")
        sources.append(first.removeprefix("# Source: "))
        manifests.append(yaml.safe_load(rest))
    return Rendered(manifests, sources, values, notes.strip(), text)


def validate_manifests(manifests: Iterable[dict[str, Any]], kube_versions: Iterable[str]) -> tuple[list[str], set[str]]:
    """(errors, kinds without a Kubernetes schema): every manifest checked strictly for every version."""
    errors: list[str] = []
    unknown: set[str] = set()
    for m in manifests:
        for version in kube_versions:
            where = f"{m.get('kind')}/{m.get('metadata', {}).get('name')} on {version}"
            try:
                kubernetes_validate.validate(m, version, strict=True)
            except kubernetes_validate.SchemaNotFoundError:
                unknown.add(f"{m.get('apiVersion')}/{m.get('kind')}")
            except kubernetes_validate.ValidationError as e:
                path = "/".join(str(p) for p in e.absolute_path)
                errors.append(f"{where}: {path}: {e.message}")
    return errors, unknown


def chart_file_drift(repo: Path = REPO, chart: Path = CHART) -> list[str]:
    """How the chart's copies differ from the generated originals (empty when they are equal)."""
    drift: list[str] = []
    for src_dir, pattern, dst_dir in CHART_COPIES:
        src = {p.name: p for p in (repo / src_dir).glob(pattern)}
        dst = {p.name: p for p in (chart / dst_dir).glob(pattern)}
        drift += [f"{dst_dir}/{n} is missing (copy of {src_dir}/{n})" for n in sorted(src.keys() - dst.keys())]
        drift += [f"{dst_dir}/{n} has no original in {src_dir}" for n in sorted(dst.keys() - src.keys())]
        drift += [f"{dst_dir}/{n} differs from {src_dir}/{n}" for n in sorted(src.keys() & dst.keys())
                  if not filecmp.cmp(src[n], dst[n], shallow=False)]
    return drift


def sync_chart_files(repo: Path = REPO, chart: Path = CHART) -> list[str]:
    """Make the chart's copies equal the originals; returns what changed."""
    changed = chart_file_drift(repo, chart)
    for src_dir, pattern, dst_dir in CHART_COPIES:
        (chart / dst_dir).mkdir(parents=True, exist_ok=True)
        for stale in (chart / dst_dir).glob(pattern):
            if not (repo / src_dir / stale.name).exists():
                stale.unlink()
        for src in (repo / src_dir).glob(pattern):
            shutil.copyfile(src, chart / dst_dir / src.name)
    return changed


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kube-version", action="append", help="render for this version (repeatable; default 1.33)")
    p.add_argument("--set", action="append", default=[], help="as helm's --set (repeatable)")
    p.add_argument("--set-string", action="append", default=[])
    p.add_argument("-f", "--values", action="append", default=[], type=Path)
    p.add_argument("--print", action="store_true", help="print the rendered manifests")
    p.add_argument("--sync-files", action="store_true", help="copy dashboards/json and dashboards/rules into the chart")
    args = p.parse_args(argv)
    if args.sync_files:
        for line in sync_chart_files() or ["chart copies already up to date"]:
            print(line)
        return 0
    binary = build_renderer()
    failed = False
    for kube in args.kube_version or ["1.33"]:
        try:
            out = render(binary, kube_version=kube, sets=args.set, set_strings=args.set_string,
                         values_files=args.values)
        except ChartError as e:
            print(f"Error: {e}", file=sys.stderr)
            return 1
        if args.print:
            print(out.text)
        errors, unknown = validate_manifests(out.manifests, [kube])
        for line in errors:
            print(line, file=sys.stderr)
        failed |= bool(errors)
        note = f"; no Kubernetes schema for {', '.join(sorted(unknown))}" if unknown else ""
        print(f"kube {kube}: {len(out.manifests)} manifests, {len(errors)} errors{note}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
