"""helm-render behaves as `helm template` where the chart depends on it: values typing and merging (--set,
--set-string, -f, null deletes a default), helm's functions (include, tpl, required, fail, toYaml, lookup),
.Files, .Capabilities, partials, NOTES.txt, .helmignore, and helm's error messages.

The expectations are helm v3's behaviour, including its quirks: numbers from values files are float64 (a
large one prints as 1e+06), values are YAML 1.1 (a bare `y` is true), and `--set list[2]=z` builds a new
list in the user's values that replaces the default one whole.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import chart_check  # tools/helm_render/chart_check.py, put on sys.path by conftest.py
import pytest
import yaml  # type: ignore[import-untyped]

REPO = Path(__file__).resolve().parents[2]

CHART = {
    "Chart.yaml": "apiVersion: v2\nname: demo\nversion: 0.1.0\nappVersion: '2.0'\nkubeVersion: '>=1.20.0-0'\n",
    "values.yaml": "port: 8000\nbig: 1000000\nratio: 0.5\nkeep: kept\ndrop: dropped\n"
                   "nested: {a: 1, b: {c: two}}\nlist: [x, y]\n",
    ".helmignore": "*.bak\n",
    "files/a.txt": "alpha\n",
    "files/sub/b.txt": "beta\n",
    "files/c.bak": "ignored\n",
    "templates/_helpers.tpl": '{{- define "demo.greeting" -}}hello {{ .name }}{{- end -}}\n',
    "templates/NOTES.txt": "Installed {{ .Release.Name }} in {{ .Release.Namespace }}.\n",
    "templates/empty.yaml": "{{- if false }}\nkind: Nothing\n{{- end }}\n",
    "templates/cm.yaml": """\
apiVersion: v1
kind: ConfigMap
metadata:
  name: {{ .Release.Name }}-{{ .Chart.Name }}
  namespace: {{ .Release.Namespace }}
data:
  port: {{ .Values.port | quote }}
  portKind: {{ kindOf .Values.port | quote }}
  big: {{ .Values.big | quote }}
  ratio: {{ .Values.ratio | quote }}
  hasDrop: {{ hasKey .Values "drop" | quote }}
  keep: {{ .Values.keep | quote }}
  list: {{ .Values.list | toJson | quote }}
  nested: {{ .Values.nested | toJson | quote }}
  include: {{ include "demo.greeting" (dict "name" .Chart.AppVersion) | quote }}
  tpl: {{ tpl "{{ .Release.Name }}:{{ .Values.port }}" . | quote }}
  {{- $kv := .Capabilities.KubeVersion }}
  kube: {{ printf "%s %s %s" $kv.Version $kv.Major $kv.Minor | quote }}
  hasMonitoring: {{ .Capabilities.APIVersions.Has "monitoring.coreos.com/v1" | quote }}
  missing: "{{ .Values.nope }}"
  lookup: {{ lookup "v1" "Secret" "default" "x" | toJson | quote }}
  template: {{ .Template.Name | quote }}
  files: "{{ range $path, $_ := .Files.Glob "files/*.txt" }}{{ $path }};{{ end }}"
  allFiles: "{{ range $path, $_ := .Files.Glob "files/**.txt" }}{{ $path }};{{ end }}"
  ignored: {{ .Files.Get "files/c.bak" | quote }}
  fromYaml: {{ (fromYaml "a: [1, 2]").a | toJson | quote }}
  asConfig: |
    {{- (.Files.Glob "files/*.txt").AsConfig | nindent 4 }}
  toYaml: |
    {{- toYaml .Values.nested | nindent 4 }}
""",
}


cc = chart_check


def make_chart(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


@pytest.fixture(scope="module")
def demo(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_chart(tmp_path_factory.mktemp("demo"), CHART)


def run(renderer: Path, chart: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(renderer), "rel", str(chart), *args], capture_output=True, text=True, timeout=60)


def data(renderer: Path, chart: Path, *args: str) -> dict[str, str]:
    proc = run(renderer, chart, *args)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    assert [d["kind"] for d in docs] == ["ConfigMap"]  # partials, NOTES.txt and empty output are not manifests
    return docs[0]["data"]  # type: ignore[no-any-return]


def test_defaults_and_helm_functions(renderer: Path, demo: Path) -> None:
    d = data(renderer, demo, "-n", "team", "--kube-version", "1.29.3")
    assert (d["port"], d["portKind"], d["big"], d["ratio"]) == ("8000", "float64", "1e+06", "0.5")
    assert (d["hasDrop"], d["keep"], d["list"]) == ("true", "kept", '["x",true]')
    assert d["nested"] == '{"a":1,"b":{"c":"two"}}' and d["toYaml"] == "a: 1\nb:\n  c: two\n"
    assert (d["include"], d["tpl"]) == ("hello 2.0", "rel:8000")
    assert (d["kube"], d["hasMonitoring"]) == ("v1.29.3 1 29", "false")
    assert (d["missing"], d["lookup"], d["template"]) == ("", "{}", "demo/templates/cm.yaml")
    assert (d["files"], d["allFiles"]) == ("files/a.txt;", "files/a.txt;files/sub/b.txt;")
    assert (d["ignored"], d["asConfig"]) == ("", "a.txt: |\n  alpha\n")
    assert d["fromYaml"] == "[1,2]"
    d = data(renderer, demo, "--api-versions", "monitoring.coreos.com/v1")
    assert d["hasMonitoring"] == "true"


def test_values_merge_like_helm(renderer: Path, demo: Path, tmp_path: Path) -> None:
    first, second = tmp_path / "a.yaml", tmp_path / "b.yaml"
    first.write_text("port: 1\nkeep: from-a\nnested: {b: {d: 4}}\n")
    second.write_text("port: 2\n")
    d = data(renderer, demo, "-f", str(first), "-f", str(second), "--set", "drop=null,list={p,q},nested.a=7")
    assert (d["port"], d["keep"], d["hasDrop"], d["list"]) == ("2", "from-a", "false", '["p","q"]')
    assert d["nested"] == '{"a":7,"b":{"c":"two","d":4}}'
    d = data(renderer, demo, "--set", "port=9000", "--set", r"list[2]=z,nested.x\.y=dotted")
    assert (d["port"], d["portKind"], d["list"]) == ("9000", "int64", '[null,null,"z"]')
    assert '"x.y":"dotted"' in d["nested"]
    d = data(renderer, demo, "--set-string", "port=9000", "--set", "keep=a\\,b")
    assert (d["port"], d["portKind"], d["keep"]) == ("9000", "string", "a,b")
    d = data(renderer, demo, "--set", "port=007,keep=true")
    assert (d["port"], d["portKind"], d["keep"]) == ("007", "string", "true")


def test_notes_rendered_apart(renderer: Path, demo: Path) -> None:
    proc = run(renderer, demo, "-n", "team", "--notes")
    assert proc.returncode == 0 and proc.stdout.endswith("NOTES:\nInstalled rel in team.\n\n")


@pytest.mark.parametrize(("template", "message"), [
    ('{{ required "port is needed" .Values.nope }}',
     r"^Error: execution error at \(demo/templates/x.yaml:1:3\): port is needed$"),
    ('{{ include "demo.fails" . }}', r"^Error: execution error at \(demo/templates/x.yaml:1:3\): from a partial$"),
    ("{{ .Values.port", r"^Error: parse error at \(demo/templates/x.yaml:1\): unclosed action$"),
    ('{{ env "HOME" }}', r'^Error: parse error at \(demo/templates/x.yaml:1\): function "env" not defined$'),
    ("kind: [unclosed", r"^Error: YAML parse error on demo/templates/x.yaml: yaml: line 1: did not find expected"),
])
def test_errors_read_as_helms(renderer: Path, tmp_path: Path, template: str, message: str) -> None:
    partial = '{{ define "demo.fails" }}{{ fail "from a partial" }}{{ end }}'
    chart = make_chart(tmp_path, {"Chart.yaml": CHART["Chart.yaml"], "values.yaml": "port: 1\n",
                                  "templates/_fail.tpl": partial, "templates/x.yaml": template})
    proc = run(renderer, chart)
    assert proc.returncode == 1 and proc.stdout == ""
    assert re.match(message, proc.stderr.strip()), proc.stderr


def test_bad_invocations(renderer: Path, demo: Path, tmp_path: Path) -> None:
    assert "chart requires kubeVersion: >=1.20.0-0 which is incompatible with Kubernetes v1.19.0" in run(
        renderer, demo, "--kube-version", "1.19").stderr
    assert "could not find template templates/nope.yaml in chart" in run(
        renderer, demo, "--show-only", "templates/nope.yaml").stderr
    assert 'key "novalue" has no value' in run(renderer, demo, "--set", "novalue").stderr
    assert "is not a chart" in run(renderer, tmp_path).stderr
    assert "unknown flag: --bogus" in run(renderer, demo, "--bogus").stderr
