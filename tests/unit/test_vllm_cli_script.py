"""The `.venv/bin/vllm` script scripts/setup-venv.sh writes must survive multiprocessing's spawn.

vLLM's engine core is started with spawn: the child runs the parent's main script again as `__mp_main__`. A
script that calls `main()` unguarded starts a second vLLM in the child, which dies ("An attempt has been made to
start a new process before the current process has finished its bootstrapping phase"), and `vllm serve` never
comes up (nu16's run, started as docs/by-hand.md says: tests/fixtures/vllm-startup/vllm-serve-unguarded-script.log).
"""

from __future__ import annotations

import re
import runpy
import subprocess
import sys
from pathlib import Path

import pytest

import attrib_agent.lab.vllm_cli as vllm_cli

REPO = Path(__file__).resolve().parents[2]
WRITE_SCRIPT = re.compile(r"^printf .*?> \"\$VENV/bin/vllm\"$", re.M | re.S)


def _written_script(tmp_path: Path) -> Path:
    """Run setup-venv.sh's own lines that write `$VENV/bin/vllm`, into a scratch venv."""
    (tmp_path / "bin").mkdir()
    (tmp_path / "bin" / "python").symlink_to(sys.executable)
    m = WRITE_SCRIPT.search((REPO / "scripts" / "setup-venv.sh").read_text())
    assert m, "setup-venv.sh no longer writes $VENV/bin/vllm with printf"
    subprocess.run(["bash", "-c", m.group(0)], env={"VENV": str(tmp_path), "PATH": "/usr/bin:/bin"}, check=True)
    return tmp_path / "bin" / "vllm"


def _spy(monkeypatch: pytest.MonkeyPatch) -> list[object]:
    """Stand in for the CLI's main: record each call, return 0."""
    calls: list[object] = []

    def main(*args: object) -> int:
        calls.append(args)
        return 0

    monkeypatch.setattr(vllm_cli, "main", main)
    return calls


def test_spawned_child_does_not_run_the_cli_again(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _written_script(tmp_path)
    calls = _spy(monkeypatch)
    runpy.run_path(str(script), run_name="__mp_main__")  # what spawn's child does with the parent's script
    assert calls == []


def test_run_as_a_command_it_runs_the_cli(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    script = _written_script(tmp_path)
    calls = _spy(monkeypatch)
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(script), run_name="__main__")
    assert done.value.code == 0 and calls == [()]
    assert script.read_text().startswith(f"#!{tmp_path / 'bin' / 'python'}\n")
