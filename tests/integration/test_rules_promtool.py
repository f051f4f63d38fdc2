"""The alert rules pass `promtool check rules` and their unit tests (`promtool test rules`)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

from conftest import REPO

RULES_DIR = REPO / "dashboards" / "rules"
PROMTOOL = shutil.which("promtool") or "/usr/bin/promtool"


def _promtool(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([PROMTOOL, *args], cwd=RULES_DIR, capture_output=True, text=True, timeout=60)


def test_check_rules() -> None:
    r = _promtool("check", "rules", "attrib-agent.rules.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS: 5 rules found" in r.stdout


def test_rule_unit_tests_pass() -> None:
    r = _promtool("test", "rules", "attrib-agent.rules.test.yml")
    assert r.returncode == 0, r.stdout + r.stderr
    assert "SUCCESS" in r.stdout


def test_every_alert_is_tested_and_labelled() -> None:
    rules = (RULES_DIR / "attrib-agent.rules.yml").read_text()
    tests = (RULES_DIR / "attrib-agent.rules.test.yml").read_text()
    alerts = re.findall(r"- alert: (\w+)", rules)
    assert len(alerts) == 5
    for name in alerts:
        assert f"alertname: {name}" in tests, f"{name} has no promtool test case"
    assert rules.count("severity:") == rules.count("summary:") == rules.count("description:") == len(alerts)


def test_a_broken_rule_is_refused(tmp_path: Path) -> None:
    """The check is real: promtool rejects a rules file with a PromQL error and names the problem."""
    good = (RULES_DIR / "attrib-agent.rules.yml").read_text()
    bad = good.replace("attrib_cost_model_fitted == 0", "attrib_cost_model_fitted ==")
    assert bad != good
    path = tmp_path / "bad.rules.yml"
    path.write_text(bad)
    r = _promtool("check", "rules", str(path))
    assert r.returncode != 0 and "parse error" in (r.stdout + r.stderr)
