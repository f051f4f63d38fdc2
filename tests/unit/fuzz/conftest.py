"""Every fuzz test's case count goes into pytest's terminal summary (tests/conftest.py prints the section),
so CI logs show them without `-s`. The lines ride on the test's report, so a pytest-xdist worker's counts
reach the controller's summary too."""

from __future__ import annotations

import pytest

from .mutate import REPORTED


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]):  # type: ignore[no-untyped-def]
    outcome = yield
    if REPORTED:
        outcome.get_result().fuzz_counts = list(REPORTED)
        REPORTED.clear()
