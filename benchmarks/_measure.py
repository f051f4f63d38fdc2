"""What every benchmark measures the same way: the machine, one pinned core, CPU and wall time, RSS, sizes.

Both wall and CPU seconds are printed: on a shared machine other processes steal wall time from a pinned
core, and CPU time is what the agent itself spent.
"""

from __future__ import annotations

import os
import platform
import resource
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attrib_agent.pipeline import AttributionPipeline


def pin_one_core(cpu: int | None = 1) -> str:
    """Run on one core, like `taskset -c 1`, so a figure means one core's worth; returns what was done."""
    if cpu is None or not hasattr(os, "sched_setaffinity"):
        return "not pinned"
    allowed = os.sched_getaffinity(0)
    if cpu not in allowed:
        cpu = min(allowed)
    os.sched_setaffinity(0, {cpu})
    return f"pinned to CPU {cpu} of {sorted(allowed)}"


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    load = " ".join(f"{x:.2f}" for x in os.getloadavg()) if hasattr(os, "getloadavg") else "?"
    return (f"{os.cpu_count()} x {model}; Python {platform.python_version()} on {platform.system()} "
            f"{platform.release()}; load average {load}")


def _status_kb(field: str) -> int | None:
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return None


def rss_mb() -> float:
    """Resident set size now (VmRSS), MB; falls back to the peak from getrusage off Linux."""
    kb = _status_kb("VmRSS")
    if kb is None:
        kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024


def peak_rss_mb() -> float:
    kb = _status_kb("VmHWM")
    return (kb if kb is not None else resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) / 1024


@dataclass
class Span:
    wall_s: float = 0.0
    cpu_s: float = 0.0


@contextmanager
def timed() -> Iterator[Span]:
    span = Span()
    w, c = time.perf_counter(), time.process_time()
    try:
        yield span
    finally:
        span.wall_s, span.cpu_s = time.perf_counter() - w, time.process_time() - c


def pipeline_sizes(p: AttributionPipeline) -> dict[str, Any]:
    """Every structure of the pipeline that grows with traffic, to spot the one that does not stop."""
    return {
        "results": len(p.store), **{f"timeline_{k}": v for k, v in p.timeline.sizes().items()},
        "spans": len(p._spans), "due": len(p._due), "partial": len(p._partial),
        "cost_window_steps": p.attributor.cost.window_steps,
        "tally_keys": len(p.tally.attributed_s) + len(p.tally.unexplained_s) + len(p.tally.histograms),
    }
