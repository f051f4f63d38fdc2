"""The lab's lateness probe: a heartbeat process beside a load client that cannot report its own lateness.

A third-party client (`vllm bench serve`) times requests from when it actually sent them, and says nothing
about being starved of CPU. This process runs where that client runs (same scheduling priority, same CPUs:
lab/client.py's `_raise_priority`, the cores from lab/cpus.py) and wakes every 10 ms; how late it wakes is
how late a client there could have been. `python -m attrib_agent.lab.probe OUT.json [CPU ...]` runs until
SIGTERM/SIGINT, then writes its samples as `[[unix time, lateness s], ...]` (100 a second; the lab stops it
with its run, at most lab/bench.py's BENCH_TIMEOUT_S, so at most ~30,000 samples).
"""

from __future__ import annotations

import asyncio
import gc
import json
import os
import signal
import sys
from collections.abc import Sequence
from typing import Any

from attrib_agent.lab.client import Clock, _heartbeat, _raise_priority


async def _run() -> list[tuple[float, float]]:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    samples: list[tuple[float, float]] = []
    await _heartbeat(stop, Clock(), samples)
    return samples


def client_place(cpus: Sequence[int] | None) -> None:
    """Put this process where the lab's clients run: real-time (or high) priority, off the engine's cores."""
    _raise_priority()
    if cpus:
        os.sched_setaffinity(0, list(cpus))


def lateness_summary(samples: Sequence[Sequence[float]], start_ts: float, end_ts: float) -> dict[str, Any]:
    """The probe's lateness while requests were in flight ([start_ts, end_ts]); the same keys as lab/client.py."""
    late = sorted(s[1] for s in samples if start_ts <= s[0] <= end_ts)
    worst = sorted((s for s in samples if start_ts <= s[0] <= end_ts), key=lambda s: s[1])[-5:]
    return {
        "source": "probe",
        "heartbeat_interval_s": 0.010,
        "heartbeat_samples": len(late),
        "heartbeat_lateness_max_s": late[-1] if late else 0.0,
        "heartbeat_lateness_p99_s": late[int(0.99 * (len(late) - 1))] if late else 0.0,
        "heartbeat_top_s": [round(x, 4) for x in late[-5:]],
        "heartbeat_top_at_s": [round(s[0] - start_ts, 3) for s in worst],
        "window_s": [start_ts, end_ts],
        # No send lag: the client decides its own send times and does not report them.
        "lateness_s": late[-1] if late else 0.0,
    }


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if not args:
        print("usage: python -m attrib_agent.lab.probe OUT.json [CPU ...]", file=sys.stderr)
        return 2
    client_place([int(c) for c in args[1:]] or None)
    gc.collect()
    gc.disable()  # a collector pause would read as lateness
    samples = asyncio.run(_run())
    summary = {"scheduling_policy": "SCHED_RR" if os.sched_getscheduler(0) == os.SCHED_RR else "SCHED_OTHER",
               "scheduling_priority": os.getpriority(os.PRIO_PROCESS, 0), "cpus": sorted(os.sched_getaffinity(0))}
    with open(args[0], "w") as f:
        json.dump({"samples": [[round(t, 4), round(x, 5)] for t, x in samples], **summary}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
