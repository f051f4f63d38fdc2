"""Garbage-collector pauses of the agent at GPU rates (issue 14 item 5), in process, on the GPU-rate stream.

    .venv/bin/python -m benchmarks.gc_pauses              # 120,000 events (~90 s): the agent's freezer, and 1 s
    .venv/bin/python -m benchmarks.gc_pauses --events 30000 --every-s 30 10 5 --freeze-at 20000 5000

A pause of the collector holds the GIL, so it stalls the event loop the API answers on, whichever thread
triggered it. The api_load server holds a still store (nothing is fed while it serves), so its collections
say little about an agent fed 1,000+ events a second. Here the stream's events are fed to an AgentCore as the
live agent feeds them (inline, one thread; share floor 0.01, as `metrics_render`), with the agent's
`GcFreezer` ticking every second of event time, as `AgentCore.serve`: `--freeze-at N` a pass once N survivors
gathered (the agent's default: FREEZE_AT), `--every-s S` a pass every S s whatever survived (last session's
rule). Each runs in its own process (a fresh heap). Printed per pass: collections by generation, the longest
and p99 pause of each (thread CPU inside the collector's start/stop callbacks), the freezer's own passes, and
the objects frozen. Wall pauses are longer on a busy core; CPU is what the agent decides.
"""

from __future__ import annotations

import argparse
import gc
import json
import subprocess
import sys
import time
from itertools import islice

from attrib_agent.agent.gc_freeze import FREEZE_AT, FREEZE_EVERY_S
from benchmarks._gpu_rate import cached_gpu_rate
from benchmarks._measure import machine

SHARE_FLOOR = 0.01


def one_pass(events: int, every_s: float, freeze_at: int) -> dict[str, object]:
    from attrib_agent.agent.core import AgentCore
    from attrib_agent.agent.gc_freeze import GcFreezer
    from attrib_agent.pipeline import AttributionPipeline
    from attrib_agent.sources.replay import ReplaySource

    info = cached_gpu_rate(600.0)
    core = AgentCore(AttributionPipeline(), threaded=False)
    p = core.pipeline
    p.attribute_share, p.pass_gap_s = SHARE_FLOOR, min(10.0, p.config.settle_interval_s / SHARE_FLOOR)
    now = [0.0]
    freezer = GcFreezer(every_s=every_s, freeze_at=freeze_at, clock=lambda: now[0])
    pauses: dict[int, list[float]] = {0: [], 1: [], 2: []}
    began = [0.0]
    in_freezer = [False]

    def on_gc(phase: str, gc_info: dict[str, int]) -> None:
        if phase == "start":
            began[0] = time.thread_time()
        elif not in_freezer[0]:
            pauses[gc_info["generation"]].append(time.thread_time() - began[0])

    gc.collect()
    gc.callbacks.append(on_gc)
    next_tick = None
    for ev in islice(ReplaySource(info.path).events(), events):
        core.process(ev)
        now[0] = ev.ts
        if next_tick is None:
            freezer.start()
            next_tick = ev.ts + 1.0
        elif ev.ts >= next_tick:
            in_freezer[0] = True
            t0 = time.thread_time()
            if freezer.tick():
                pauses.setdefault(-1, []).append(time.thread_time() - t0)
            in_freezer[0] = False
            next_tick = ev.ts + 1.0
    gc.callbacks.remove(on_gc)
    frozen = gc.get_freeze_count()
    gc.unfreeze()  # what the hourly full pass would find: cyclic garbage that was frozen while still alive
    out: dict[str, object] = {"every_s": every_s, "freeze_at": freeze_at, "frozen": frozen, "results": len(p.store),
                              "frozen_garbage": gc.collect()}
    for gen, xs in sorted(pauses.items()):
        s = sorted(xs)
        name = "freezer" if gen < 0 else f"gen{gen}"
        out[name] = {"n": len(s), "max_ms": 1000 * s[-1] if s else 0.0,
                     "p99_ms": 1000 * s[min(len(s) - 1, int(0.99 * len(s)))] if s else 0.0,
                     "sum_s": sum(s)}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=120_000)
    ap.add_argument("--every-s", type=float, nargs="*", default=[1.0], help="fixed periods (s) to compare")
    ap.add_argument("--freeze-at", type=int, nargs="*", default=[FREEZE_AT], help="survivor counts to compare")
    ap.add_argument("--one", default=None, help=argparse.SUPPRESS)  # "every_s:freeze_at", in its own process
    args = ap.parse_args(argv)
    if args.one is not None:
        every, at = args.one.split(":")
        print(json.dumps(one_pass(args.events, float(every), int(at))))
        return 0
    print(f"{machine()}\nGPU-rate stream, first {args.events:,} events, share {SHARE_FLOOR}; thread CPU per pause")
    runs = [(FREEZE_EVERY_S, at) for at in args.freeze_at] + [(every, 0) for every in args.every_s]
    for every, at in runs:
        out = subprocess.run([sys.executable, "-m", "benchmarks.gc_pauses", "--events", str(args.events),
                              "--one", f"{every}:{at}"], capture_output=True, text=True, check=True).stdout
        r = json.loads(out.splitlines()[-1])
        line = ", ".join(f"{k} {v['n']} (max {v['max_ms']:.1f} ms, p99 {v['p99_ms']:.2f}, {v['sum_s']:.2f} s)"
                         for k, v in r.items() if isinstance(v, dict))
        rule = f"freeze at {at:,} survivors" if at else f"freeze every {every:g} s"
        print(f"{rule}: {line}; {r['frozen']:,} objects frozen at the end, of which "
              f"{r['frozen_garbage']:,} cyclic garbage (freed by the hourly full pass); {r['results']:,} results")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
