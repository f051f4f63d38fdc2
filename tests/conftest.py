import os
from pathlib import Path
from typing import Any

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    return FIXTURES


@pytest.fixture(scope="session")
def otlp_export_body(fixtures_dir: Path) -> bytes:
    """A real OTLP export request body, as vLLM POSTed it during a recorded run."""
    from attrib_agent.recording import OTLP, Recording, otlp_body

    rec = Recording(fixtures_dir / "recordings" / "shorts")
    return otlp_body(next(rec.records(OTLP)))


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--update-golden", action="store_true", default=False,
                     help="rewrite golden files under tests/golden/ from the current output")


@pytest.fixture
def golden(request: pytest.FixtureRequest):
    """golden(relpath, text): compare with tests/golden/<relpath>, or rewrite it with --update-golden."""
    update = request.config.getoption("--update-golden")

    def check(relpath: str, text: str) -> None:
        path = Path(__file__).parent / "golden" / relpath
        if update or not path.exists():
            if not update:
                pytest.fail(f"golden file {path} missing; run pytest --update-golden to create it")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
            return
        assert text == path.read_text(), f"output differs from {path}; if intended, run pytest --update-golden"

    return check


# Skips CI may take, as {a text in the skip's reason: why CI cannot run that test}. Under CI=true (set by the CI
# runner) any other skip fails the run: a test that never runs in CI checks nothing, so everything a test needs
# is installed by the project's setup (scripts/setup-*.sh, `make test`). Empty: CI runs every test.
ALLOWED_SKIPS: dict[str, str] = {}
_skips: dict[str, list[str]] = {"allowed": [], "unexpected": []}
_fuzz_counts: list[str] = []  # lines the fuzz tests put on their reports (tests/unit/fuzz/conftest.py)


def _in_ci() -> bool:
    return os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _skip_reason(report: pytest.TestReport | pytest.CollectReport) -> str:
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def _police_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Mark a skip allowed or unexpected; in CI, turn one not in ALLOWED_SKIPS into a failure that says why.
    Runs where the test runs (a pytest-xdist worker too): the mark travels with the report to the controller."""
    if not report.skipped or hasattr(report, "wasxfail"):
        return
    reason = _skip_reason(report)
    if any(text in reason for text in ALLOWED_SKIPS):
        report.attrib_skip = ("allowed", f"{report.nodeid}: {reason}")  # type: ignore[union-attr]
        return
    report.attrib_skip = ("unexpected", f"{report.nodeid}: {reason}")  # type: ignore[union-attr]
    if _in_ci():
        report.outcome = "failed"
        report.longrepr = (f"skipped in CI: {reason}\n(every test runs in CI: install what it needs through the "
                           "project's setup, or add the reason to ALLOWED_SKIPS in tests/conftest.py with why)")


def _count_skip(report: pytest.TestReport | pytest.CollectReport) -> None:
    """Count a marked skip where the summary is written (the controller under pytest-xdist)."""
    mark = getattr(report, "attrib_skip", None)
    if mark is not None:
        _skips[mark[0]].append(mark[1])


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    _police_skip(outcome.get_result())


@pytest.hookimpl(hookwrapper=True)
def pytest_make_collect_report(collector: pytest.Collector):  # type: ignore[no-untyped-def]
    outcome = yield
    _police_skip(outcome.get_result())


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _count_skip(report)
    _fuzz_counts.extend(getattr(report, "fuzz_counts", ()))


def pytest_collectreport(report: pytest.CollectReport) -> None:
    _count_skip(report)


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if _fuzz_counts:
        terminalreporter.section("fuzz case counts")
        for line in _fuzz_counts:
            terminalreporter.write_line(line)
    allowed, unexpected = len(_skips["allowed"]), len(_skips["unexpected"])
    policy = "unexpected skips fail (CI=true)" if _in_ci() else "not CI: skips allowed"
    terminalreporter.write_line(f"skip policy: {allowed + unexpected} skipped ({allowed} allowed, {unexpected} "
                                f"unexpected); {policy}")
    for line in _skips["unexpected"]:
        terminalreporter.write_line(f"  unexpected skip: {line}")
