"""Step re-inference on the GPU-rate input (issue 14, item 3): how many times each step fed is inferred.

    .venv/bin/python -m benchmarks.reinference [--events N]

A landed span corrects its request from its first admission (the steps before read a fresh waiting request
only to drop it), so the timeline re-infers from the checkpoint before that step; wherever the new pass reaches
a checkpoint in the stored pass's state, it keeps the stored outcomes up to the first step a changed fact can
alter there, or to the frontier (reinference.py, fact_reads.py). The timeline pass of replay_throughput
(settle-tick reads) over the first N events, printing steps fed, inferences, re-inferences and their ratio per
step fed, and the pass's CPU seconds.
"""

from __future__ import annotations

import argparse
import time

from attrib_agent.pipeline import PipelineConfig
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import EngineTimeline
from benchmarks._gpu_rate import cached_gpu_rate
from benchmarks._measure import machine


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=100_000, help="first N events of the GPU-rate input")
    ap.add_argument("--duration", type=float, default=600.0, help="the GPU-rate input's length (event s)")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    cfg = PipelineConfig()
    tl = EngineTimeline(cfg.block_size, cfg.num_blocks, engine=cfg.engine, token_budget=cfg.token_budget)
    n, next_tick, cpu0 = 0, None, time.process_time()
    for ev in ReplaySource(cached_gpu_rate(args.duration).path).events():
        if n >= args.events:
            break
        tl.feed(ev)
        n += 1
        if next_tick is None:  # a settle's reads at its ticks, as replay_throughput's timeline pass
            next_tick = ev.ts + cfg.settle_interval_s
        elif ev.ts >= next_tick:
            next_tick = ev.ts + cfg.settle_interval_s
            tl.lifecycles()
            tl.outcomes()
    tl.outcomes()
    cpu = time.process_time() - cpu0
    fed, inferred, again = tl.inference_work()
    print(f"{n:,} events, {fed:,} steps fed: {inferred:,} step inferences ({inferred / max(fed, 1):.2f} a step), "
          f"{again:,} of them re-inferences ({again / max(fed, 1):.2f} a step); {cpu:.1f} CPU s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
