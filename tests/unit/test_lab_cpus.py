"""The lab keeps its load client off the cores vLLM's engine is bound to: read from /proc (a fake tree here)."""

from __future__ import annotations

import os
from pathlib import Path

from attrib_agent.lab.cpus import _cpu_list, client_cpus, engine_cpus


def _task(root: Path, pid: int, tid: int, pgid: int, allowed: str, comm: str = "VLLM::Worker") -> None:
    d = root / str(pid)
    (d / "task" / str(tid)).mkdir(parents=True, exist_ok=True)
    (d / "stat").write_text(f"{pid} ({comm}) S 1 {pgid} {pgid} 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0\n")
    (d / "task" / str(tid) / "status").write_text(f"Name:\t{comm}\nCpus_allowed_list:\t{allowed}\n")


def test_cpu_lists_parse_like_the_kernel_prints_them() -> None:
    assert _cpu_list("0-2,5\n") == {0, 1, 2, 5}
    assert _cpu_list("3") == {3}


def test_only_bound_threads_of_vllm_s_group_count(tmp_path: Path) -> None:
    n = os.cpu_count() or 1
    everything = f"0-{n - 1}" if n > 1 else "0"
    _task(tmp_path, 100, 100, 100, everything, "python (api server)")  # unbound: not the engine's
    _task(tmp_path, 101, 101, 100, "0")  # the worker, bound to core 0
    _task(tmp_path, 101, 102, 100, "0")
    _task(tmp_path, 200, 200, 200, "0")  # another group: ignored
    (tmp_path / "self").mkdir()  # not a pid
    assert engine_cpus(100, tmp_path) == ({0} if n > 1 else set())
    assert engine_cpus(999, tmp_path) == set()
    free = client_cpus(100, tmp_path)
    mine = os.sched_getaffinity(0)
    if n > 1 and mine - {0}:
        assert free == sorted(mine - {0})
    else:
        assert free is None
