"""Print every fuzz test's case count in pytest's terminal summary, so CI logs show them without `-s`."""

from __future__ import annotations

from typing import Any

from .mutate import REPORTED


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if REPORTED:
        terminalreporter.section("fuzz case counts")
        for line in REPORTED:
            terminalreporter.write_line(line)
