"""VllmLab.kill() and restart() without vLLM: the lab's own process handling, on stand-in process groups.

vLLM is replaced by `sh` with a background child (like vLLM's API server and its engine-core child, one
process group) and the capture process by `cat` reading its output (it exits at EOF, as capture does).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from attrib_agent.lab import server
from attrib_agent.lab.server import LabConfig, LabEndpoints, LabError, VllmLab, wait_group_gone

REAL_POPEN = subprocess.Popen


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.fixture
def fake_lab(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    """A VllmLab whose vLLM is `sh` + a `sleep` child in one group and whose capture is `cat`."""
    started: list[subprocess.Popen[bytes]] = []

    def popen(argv: list[str], **kw: Any) -> subprocess.Popen[bytes]:
        if "vllm.entrypoints.openai.api_server" in argv:
            argv = ["sh", "-c", "sleep 60 & wait"]
        elif "attrib_agent.lab.capture" in argv:
            kw["stdout"] = subprocess.DEVNULL
            argv = ["cat"]
        proc = REAL_POPEN(argv, **kw)
        started.append(proc)
        return proc

    monkeypatch.setattr(server.subprocess, "Popen", popen)
    monkeypatch.setattr(VllmLab, "_wait_healthy", lambda self, *a: None)
    lab = VllmLab(LabConfig(), workdir=tmp_path)
    (tmp_path / "vllm-logging.json").write_text("{}")
    lab.endpoints = LabEndpoints("http://127.0.0.1:1", "http://127.0.0.1:2", "tiny", 0,
                                 str(tmp_path / "server.log"), ["--port", "1"], 1)
    server._OWNERS[lab.endpoints.vllm_url] = lab
    lab._launch(lab.endpoints, tmp_path / "vllm-logging.json")
    try:
        yield lab
    finally:
        lab.stop()
        for p in started:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)


def test_kill_takes_the_whole_group_and_the_capture_exits(fake_lab: VllmLab) -> None:
    ep = fake_lab.endpoints
    assert ep is not None
    pgid = ep.vllm_pid
    assert pgid and _group_alive(pgid)
    fake_lab.kill(timeout_s=10)
    assert not _group_alive(pgid)
    assert fake_lab._capture is not None and fake_lab._capture.poll() is not None


def test_restart_runs_a_new_group_and_updates_the_endpoints_in_place(fake_lab: VllmLab) -> None:
    ep = fake_lab.endpoints
    assert ep is not None
    old = ep.vllm_pid
    fake_lab.kill(timeout_s=10)
    assert fake_lab.restart() is ep  # the same object: a fixture holding it sees the new pid
    assert ep.vllm_pid != old and _group_alive(ep.vllm_pid)
    assert VllmLab.owner_of(ep) is fake_lab
    fake_lab.stop()  # stops the new group, as the e2e fixture's teardown relies on
    assert wait_group_gone(ep.vllm_pid, 10)
    assert VllmLab.owner_of(ep) is None


def test_restart_of_a_running_lab_kills_it_first(fake_lab: VllmLab) -> None:
    ep = fake_lab.endpoints
    assert ep is not None
    old = ep.vllm_pid
    fake_lab.restart()
    assert not _group_alive(old) and _group_alive(ep.vllm_pid)


def test_restart_needs_a_started_lab(tmp_path: Path) -> None:
    with pytest.raises(LabError):
        VllmLab(workdir=tmp_path).restart()
    with pytest.raises(LabError):
        VllmLab(workdir=tmp_path).kill()


def test_owner_of_is_none_for_endpoints_this_process_did_not_start() -> None:
    ep = LabEndpoints("http://127.0.0.1:9", "http://127.0.0.1:8", "tiny", 1, "x.log", [], 1)
    assert VllmLab.owner_of(ep) is None


def test_wait_group_gone() -> None:
    proc = REAL_POPEN([sys.executable, "-c", "import time; time.sleep(30)"], start_new_session=True)
    try:
        t0 = time.monotonic()
        assert not wait_group_gone(proc.pid, 0.3)
        assert time.monotonic() - t0 < 5
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
        assert wait_group_gone(proc.pid, 5)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(5)
