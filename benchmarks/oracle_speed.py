"""Is vLLM's own scheduler (lab.oracle) a better simulator for the agent than the re-simulation?

    .venv/bin/python -m benchmarks.oracle_speed [--reps 5] [--seeds 1]

Each side's import is timed in three bare interpreters (seconds, and VmRSS after it). Then each side runs in
a fresh process pinned to one core: the first scheduler built (vLLM only: VllmConfig and ModelConfig), and
`--reps` passes over the oracle's standard workloads (synchronous, no shared prefixes), timing the seconds
per simulated step. The re-simulation is `attribution.scheduler_sim.simulate` as the agent calls it; vLLM's
side is `lab.oracle.run_vllm` without the comparison views (its own Scheduler, KVCacheManager and fake model
outputs).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time
from typing import Any

from benchmarks._measure import machine, peak_rss_mb, pin_one_core


def _part(side: str, reps: int, seeds: int, cpu: int) -> dict[str, Any]:
    pinned = pin_one_core(None if cpu < 0 else cpu)
    from attrib_agent.attribution.scheduler_sim import simulate
    from attrib_agent.lab.oracle.compare import default_cost
    from attrib_agent.lab.oracle.suite import standard_suite

    workloads = list(standard_suite(seeds, kinds=("burst", "poisson", "kv_exhaustion")))
    cost = default_cost()
    t0 = time.perf_counter()
    if side == "vllm":
        from attrib_agent.lab.oracle.vllm_scheduler import build_scheduler, run_vllm

        build_scheduler(workloads[0])
    first_build = time.perf_counter() - t0
    per_step: list[float] = []
    steps = 0
    for _ in range(reps):
        t0 = time.perf_counter()
        steps = 0
        for w in workloads:
            if side == "sim":
                steps += simulate(w.sim_requests(), w.config, cost).steps
            else:
                steps += len(run_vllm(w, cost, views=False).steps)
        per_step.append((time.perf_counter() - t0) / steps)
    return {"side": side, "pinned": pinned, "first_build_s": first_build, "steps_per_pass": steps,
            "workloads": len(workloads), "us_per_step": [x * 1e6 for x in per_step], "peak_rss_mb": peak_rss_mb()}


# What the agent would import for each simulator, in a bare interpreter: seconds and VmRSS (MB) after.
_IMPORT = {
    "sim": "import attrib_agent.attribution.scheduler_sim",
    "vllm": "import vllm.v1.core.sched.scheduler, vllm.v1.core.sched.async_scheduler, vllm.config",
}
_PROBE = ("import time; t = time.perf_counter(); {stmt}; s = time.perf_counter() - t\n"
          "rss = [int(x.split()[1]) for x in open('/proc/self/status') if x.startswith('VmRSS:')][0] / 1024\n"
          "print(s, rss)")


def _import_cost(side: str, reps: int, cpu: int) -> tuple[list[float], list[float]]:
    secs, rss = [], []
    for _ in range(reps):
        cmd = [sys.executable, "-c", _PROBE.format(stmt=_IMPORT[side])]
        if cpu >= 0:
            cmd = ["taskset", "-c", str(cpu), *cmd]
        out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout.split()
        secs.append(float(out[-2]))
        rss.append(float(out[-1]))
    return secs, rss


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--cpu", type=int, default=1)
    ap.add_argument("--part", choices=("sim", "vllm"), help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.part:
        print(json.dumps(_part(args.part, args.reps, args.seeds, args.cpu)))
        return
    print(machine())
    rows = {}
    for side in ("sim", "vllm"):
        out = subprocess.run([sys.executable, "-m", "benchmarks.oracle_speed", "--part", side, "--reps",
                              str(args.reps), "--seeds", str(args.seeds), "--cpu", str(args.cpu)],
                             check=True, capture_output=True, text=True).stdout
        rows[side] = r = json.loads(out.strip().splitlines()[-1])
        us = r["us_per_step"]
        secs, rss = _import_cost(side, 3, args.cpu)
        print(f"{side:>4}: import {statistics.median(secs):.2f} s (min {min(secs):.2f}, max {max(secs):.2f}, 3 "
              f"fresh interpreters), RSS after import {statistics.median(rss):.0f} MB; run peak RSS "
              f"{r['peak_rss_mb']:.0f} MB; first scheduler (with its imports) {r['first_build_s']:.2f} s; "
              f"{statistics.median(us):.1f} us/step (min {min(us):.1f}, "
              f"max {max(us):.1f}, {len(us)} passes of {r['steps_per_pass']} steps, {r['workloads']} workloads; "
              f"{r['pinned']})")
    ratio = statistics.median(rows["vllm"]["us_per_step"]) / statistics.median(rows["sim"]["us_per_step"])
    print(f"vLLM's scheduler per simulated step: {ratio:.1f}x the re-simulation's")


if __name__ == "__main__":
    main()
