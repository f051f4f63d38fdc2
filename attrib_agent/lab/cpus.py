"""Which CPUs vLLM's engine is bound to, so the lab's load client can stay off them.

vLLM's CPU worker binds its threads (OpenMP and the rest of its process) to the cores it computes on
(`VLLM_CPU_OMP_THREADS_BIND=auto` keeps one core for the API server and friends). A client scheduled onto
the worker's core was measured stalling for 0.4-1.1 s during a whale's prefill, even at nice -10, while the
same client on the other core stayed within tens of milliseconds: the lab pins its client to the cores the
engine leaves free, as vLLM's own CPU deployment guide does for its frontend.
"""

from __future__ import annotations

import os
from pathlib import Path

PROC = Path("/proc")


def _cpu_list(text: str) -> set[int]:
    """`0-2,5` -> {0, 1, 2, 5}."""
    out: set[int] = set()
    for part in text.strip().split(","):
        if not part:
            continue
        lo, _, hi = part.partition("-")
        out.update(range(int(lo), int(hi or lo) + 1))
    return out


def _pgid(pid_dir: Path) -> int | None:
    try:
        stat = (pid_dir / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the command name may hold spaces and parentheses
    return int(fields[2]) if len(fields) > 2 else None


def _allowed(task_dir: Path) -> set[int] | None:
    try:
        for line in (task_dir / "status").read_text().splitlines():
            if line.startswith("Cpus_allowed_list:"):
                return _cpu_list(line.split(":", 1)[1])
    except (OSError, ValueError):
        return None
    return None


def engine_cpus(pgid: int, proc: Path = PROC) -> set[int]:
    """CPUs that threads of process group `pgid` (the lab's vLLM) are bound to: the union of every thread's
    allowed set that is narrower than the machine's. Empty when nothing is bound (or /proc is not readable)."""
    everything = set(range(os.cpu_count() or 1))
    bound: set[int] = set()
    for pid_dir in proc.iterdir() if proc.is_dir() else ():
        if not pid_dir.name.isdigit() or _pgid(pid_dir) != pgid:
            continue
        tasks = pid_dir / "task"
        for task_dir in tasks.iterdir() if tasks.is_dir() else ():
            allowed = _allowed(task_dir)
            if allowed and allowed < everything:
                bound |= allowed
    return bound


def client_cpus(pgid: int, proc: Path = PROC) -> list[int] | None:
    """The CPUs this process may use that vLLM's engine is not bound to; None when there are none to choose
    (nothing bound, or the engine holds every CPU this process has)."""
    mine = os.sched_getaffinity(0)
    free = mine - engine_cpus(pgid, proc)
    return sorted(free) if free and free != mine else None
