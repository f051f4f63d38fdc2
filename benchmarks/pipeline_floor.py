"""The live pipeline thread's CPU at the share floor, in process (issue 14 item 3): what shedding cannot shed.

    .venv/bin/python -m benchmarks.pipeline_floor [--events 40000] [--reps 1] [--profile FILE] [--share 1.0]

The GPU-rate input's first `--events` events go through `AgentCore.process` in batches of 512 with the forecast
refresh after each batch, as the live agent's pipeline thread runs them, with the share at its floor
(`shedding.MIN_SHARE`) and the pass gap it gives (`Shedder.pass_gap_s`: 10 s; attribution passes at most
`pipeline.MAX_PASS_WAIT_S` apart). No I/O, no API lookups, no /metrics renders: the floor under those. Printed
per rep: thread CPU seconds over the input's event time (= cores needed at the stream's pace), and the parts
timed on the way (step inference, attribution passes, of which learning the cost models and their refits, the
forecast refresh), step inferences per step fed, and a digest of the results (stable across reps and across a
speed-only change). `--profile FILE` writes a cProfile of the last rep. `--share 1.0` attributes every victim
at every settle instead (no shedding): the live agent's first seconds, before its share falls, where the
attribution passes' cost per victim shows.
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import time
from collections import defaultdict
from collections.abc import Callable
from itertools import islice
from typing import Any

import attrib_agent.timeline.reinference as reinference
from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.shedding import MIN_SHARE, Shedder
from attrib_agent.attribution.attributor import Attributor
from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import Event
from attrib_agent.read_model import AgentState
from attrib_agent.sources.replay import ReplaySource
from benchmarks._gpu_rate import cached_gpu_rate
from benchmarks._measure import machine

PARTS = ((reinference, "infer_step", "step inference"), (Attributor, "attribute", "attribution passes"),
         (Attributor, "learn", "  learning the fits"), (StepCostModel, "_fit", "  fit refits"),
         (AgentState, "refresh_reference", "forecast refresh"))


def _timed(fn: Callable[..., Any], into: dict[str, list[float]], key: str) -> Callable[..., Any]:
    def timed(*args: Any, **kw: Any) -> Any:
        t = time.thread_time()
        try:
            return fn(*args, **kw)
        finally:
            into[key][0] += time.thread_time() - t
            into[key][1] += 1
    return timed


def run(events: list[Event], profile: str | None = None,
        share: float = MIN_SHARE) -> tuple[float, dict[str, list[float]], AgentCore]:
    parts: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    saved = [(owner, name, getattr(owner, name)) for owner, name, _ in PARTS]
    for owner, name, key in PARTS:
        setattr(owner, name, _timed(getattr(owner, name), parts, key))
    try:
        core = AgentCore.from_config(AgentConfig(), live=False)
        p = core.pipeline
        shed = Shedder(0.25, share=share)
        p.attribute_share, p.pass_gap_s = shed.share, shed.pass_gap_s(p.config.settle_interval_s)
        prof = cProfile.Profile() if profile else None
        t = time.thread_time()
        if prof is not None:
            prof.enable()
        for i in range(0, len(events), 512):
            for ev in events[i:i + 512]:
                core.process(ev)
            core.refresh_forecast()
        if prof is not None and profile:
            prof.disable()
            prof.dump_stats(profile)
        return time.thread_time() - t, parts, core
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=40_000, help="first N events of the GPU-rate input")
    ap.add_argument("--reps", type=int, default=1)
    ap.add_argument("--profile", default=None, help="write a cProfile of the last rep here")
    ap.add_argument("--share", type=float, default=MIN_SHARE, help="the attributed share (1.0: no shedding)")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    events = list(islice(ReplaySource(cached_gpu_rate(60.0).path).events(), args.events))
    span = events[-1].ts - events[0].ts
    for rep in range(args.reps):
        cpu, parts, core = run(events, args.profile if rep == args.reps - 1 else None, args.share)
        p = core.pipeline
        store = p.store
        digest = hashlib.sha256(repr(sorted(store, key=lambda r: r.request_id)).encode()).hexdigest()[:16]
        fed, inferred, _ = p.timeline.inference_work()
        print(f"rep {rep + 1}: {len(events):,} events, {span:.1f} s of the stream: {cpu:.2f} CPU s = "
              f"{cpu / span:.3f} core; {inferred / max(fed, 1):.2f} inferences a step; {len(store)} results, "
              f"{p.victims_skipped:,} skipped; results {digest}")
        for key, (secs, calls) in parts.items():
            print(f"  {key}: {secs:.2f} s = {secs / span:.3f} core ({int(calls)} calls, "
                  f"{secs / max(calls, 1) * 1e3:.2f} ms each)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
