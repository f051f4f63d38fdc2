"""Fixtures of the fault tests: a stand-in vLLM, the log file, and `attrib-agent run` processes, all loopback
and all torn down (agents SIGTERMed, then SIGKILLed) whether the test passed or not. See harness.py."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .harness import AgentProcess, LogWriter, StandInVllm, recorded


@pytest.fixture
def stand_in() -> Iterator[StandInVllm]:
    s = StandInVllm(recorded("whale1"))
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture
def log_writer(tmp_path: Path) -> Iterator[LogWriter]:
    w = LogWriter(tmp_path / "vllm.log")
    try:
        yield w
    finally:
        w.close()


AgentFactory = Callable[..., AgentProcess]


@pytest.fixture
def agent_factory(tmp_path: Path, stand_in: StandInVllm, log_writer: LogWriter,
                  request: pytest.FixtureRequest) -> Iterator[AgentFactory]:
    """make(**kwargs) starts an agent on the stand-in and the log file; every one is stopped at teardown
    (and its output printed when the test failed)."""
    agents: list[AgentProcess] = []

    def make(start: bool = True, **kwargs: Any) -> AgentProcess:
        kwargs.setdefault("workdir", tmp_path / f"agent{len(agents)}")
        a = AgentProcess(vllm_url=stand_in.url, log_file=log_writer.path, **kwargs)
        agents.append(a)
        if start:
            a.start()
        return a

    try:
        yield make
    finally:
        for a in agents:
            a.stop()
        rep = getattr(request.node, "rep_call", None)
        if rep is not None and rep.failed:
            for a in agents:
                print(f"---- {a.workdir.name} output (tail) ----\n{a.tail(6000)}")


@pytest.hookimpl(wrapper=True, tryfirst=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    rep = yield
    if rep.when == "call":
        item.rep_call = rep  # type: ignore[attr-defined]
    return rep
