"""The chart under real Helm (v4, PyPI's helm-sdkpy in .venv-helm): `helm lint` of every supported values set
and `helm package`, and the cross-check with helm-render (which renders what real Helm cannot here without a
cluster): whatever helm-render renders lints clean under Helm, and a broken template fails both.

Lint renders every template with the values (leniently: a missing `required` value or a `fail` reached is
only logged, and real_helm counts those as failures), checks the values against values.schema.json and the
rendered YAML.
"""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path
from typing import Any

import chart_check  # tools/helm_render/, put on sys.path by conftest.py
import pytest
import real_helm
import yaml  # type: ignore[import-untyped]
from chart_values import MODES, VALUE_SETS, VLLM_EXAMPLE_CHART, merged, values_file

CHART = real_helm.CHART
# Every mode with every values set, and sidecar-only for vLLM's example chart.
SUPPORTED = {f"{mode}/{name}": (MODES[mode], VALUE_SETS[name]) for mode in MODES for name in VALUE_SETS}
SUPPORTED["sidecar-only/vllm-example-chart"] = (MODES["sidecar-only"], VLLM_EXAMPLE_CHART)
# The one message Helm's lint gives this chart: Chart.yaml has no icon (helm lint prints "[INFO] Chart.yaml:
# icon is recommended"; helm-sdkpy passes the severity and path, not the text).
EXPECTED_INFO = ["Chart.yaml"]


@pytest.fixture(scope="session")
def helm() -> str:
    """Real Helm is there (scripts/setup-helm-venv.sh, run by `make test`): fail, never skip, without it."""
    try:
        return real_helm.version()
    except real_helm.HelmUnavailable as e:
        pytest.fail(str(e))


def copy_chart(tmp_path: Path) -> Path:
    dest = tmp_path / CHART.name
    shutil.copytree(CHART, dest)
    return dest


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_every_values_set_lints_clean(helm: str, name: str) -> None:
    result = real_helm.lint(CHART, SUPPORTED[name])
    assert result.clean, (result, result.log)
    assert result.at("info") == EXPECTED_INFO


@pytest.mark.parametrize("name", sorted(SUPPORTED))
def test_renderer_values_equal_helms_coalescing(renderer: Path, name: str) -> None:
    """What helm-render renders with (its --dump-values of the -f file) is what real Helm linted."""
    out = chart_check.render(renderer, values_files=[values_file(merged(*SUPPORTED[name]))])
    assert out.values == real_helm.coalesce(real_helm.chart_values(), merged(*SUPPORTED[name]))


def test_lint_catches_what_it_should(helm: str) -> None:
    """Lint is no rubber stamp: the chart's defaults miss the model (a `required`), a `fail` of the chart's
    checks, a wrong type or an unknown value breaks the schema: all failures."""
    defaults = real_helm.lint(CHART)
    assert not defaults.clean and defaults.logged_failures == (
        "vllm.model is required in deploy mode: the model vLLM serves (e.g. --set vllm.model=Qwen/Qwen2.5-1.5B"
        "-Instruct)",)
    wrong_type = real_helm.lint(CHART, [MODES["deploy"], {"agent": {"port": "port"}}])
    assert not wrong_type.clean and "values.yaml" in wrong_type.at("error")
    both_tokens = real_helm.lint(CHART, [MODES["deploy"],
                                         {"agent": {"apiToken": {"value": "a", "existingSecret": "b"}}}])
    assert both_tokens.logged_failures == ("agent.apiToken: set existingSecret or value, not both",)
    unknown = real_helm.lint(CHART, [MODES["deploy"], {"exactMode": {"install": "pip"}}])
    assert not unknown.clean and "values.yaml" in unknown.at("error")


# Broken templates: a parse error, a YAML error in the output, a `fail` reached with the values, a value the
# schema refuses. Each file is added to a copy of the chart.
BROKEN = {
    "unclosed-action": ("templates/broken.yaml", "kind: ConfigMap\nname: {{ .Values.agent.port\n"),
    "bad-yaml": ("templates/broken.yaml", "apiVersion: v1\nkind: ConfigMap\nmetadata: [unclosed\n"),
    "fail": ("templates/broken.yaml", '{{ if .Values.vllm.model }}{{ fail "broken on purpose" }}{{ end }}\n'),
    "undefined-function": ("templates/broken.yaml", '{{ nosuchfunction "x" }}\n'),
}


@pytest.mark.parametrize("breakage", sorted(BROKEN))
def test_a_broken_template_fails_both(helm: str, renderer: Path, tmp_path: Path, breakage: str) -> None:
    chart = copy_chart(tmp_path)
    path, text = BROKEN[breakage]
    (chart / path).write_text(text)
    values = SUPPORTED["deploy/defaults"]
    result = real_helm.lint(chart, values)
    # Helm names the file for a YAML error, the directory for a parse error; a `fail` is only logged.
    assert not result.clean, result
    if breakage == "fail":
        assert result.logged_failures == ("broken on purpose",), result
    else:
        assert any(p.startswith("templates/") for p in result.at("error")), result
    with pytest.raises(chart_check.ChartError, match="broken"):
        chart_check.render(renderer, chart=chart, values_files=[values_file(merged(*values))])
    (chart / path).unlink()  # the same copy without the breakage passes both: the failure was the template's
    assert real_helm.lint(chart, values).clean
    chart_check.render(renderer, chart=chart, values_files=[values_file(merged(*values))])


def test_package_holds_the_whole_chart(helm: str, renderer: Path, tmp_path: Path) -> None:
    archive = real_helm.package(tmp_path / "dist")
    meta = yaml.safe_load((CHART / "Chart.yaml").read_text())
    assert archive.name == f"{meta['name']}-{meta['version']}.tgz"
    with tarfile.open(archive) as tar:
        members = {m.name: m for m in tar.getmembers() if m.isfile()}
        tar.extractall(tmp_path / "unpacked", filter="data")
    wanted = {f"{CHART.name}/{p.relative_to(CHART)}" for p in CHART.rglob("*") if p.is_file()}
    assert set(members) == wanted
    unpacked = tmp_path / "unpacked" / CHART.name
    assert yaml.safe_load((unpacked / "Chart.yaml").read_text()) == meta
    for rel in ("values.yaml", "values.schema.json", "templates/_pod.tpl", "dashboards", "rules"):
        src = CHART / rel
        files = [src] if src.is_file() else sorted(src.iterdir())
        assert files and all((unpacked / f.relative_to(CHART)).read_bytes() == f.read_bytes() for f in files)
    # The archive is a chart Helm loads and renders (its defaults miss only the model, as the source's do),
    # and unpacked it lints clean and helm-render renders it the same as the source.
    assert real_helm.lint(archive).logged_failures == real_helm.lint(CHART).logged_failures != ()
    values = SUPPORTED["deploy/monitors"]
    assert real_helm.lint(unpacked, values).clean
    files = [values_file(merged(*values))]
    source: Any = chart_check.render(renderer, values_files=files)
    packaged: Any = chart_check.render(renderer, chart=unpacked, values_files=files)
    assert packaged.manifests == source.manifests and len(source.manifests) >= 8
