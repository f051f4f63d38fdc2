"""Exact mode on the recordings made with the step plugin: a digest of every result and of the final timeline, and
what the pipeline pass and the timeline's reads cost.

Each `*-steps` recording through `AttributionPipeline` with the plugin's stream (`replay --exact`'s input), as read
and with the plugin's messages `--late` seconds late (a busy host: steps logged before their plugin facts come):
the results emitted and the final outcomes and preemptions are hashed (a change meant to keep exact mode's answers
keeps both digests). CPU, the least of `--reps` runs, events decoded first: the whole pass, and an exact-mode
timeline's outcomes read once a second of event time, as a live agent's passes and scrapes read them (the plugin's
overlay; the step inference brought up to date first, untimed).

    .venv/bin/python -m benchmarks.exact_digest [--reps 3] [--late 3.0] [--cpu 0]
"""

from __future__ import annotations

import argparse
import hashlib
import time
from dataclasses import replace
from pathlib import Path

from attrib_agent.events import Event, SchedulerHello, SchedulerStep
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import EngineTimeline
from benchmarks._measure import machine, pin_one_core

RECORDINGS = Path(__file__).resolve().parents[1] / "tests" / "fixtures" / "recordings"


def plugin_late(events: list[Event], by: float) -> list[Event]:
    """The events as read when the plugin's messages come `by` seconds late."""
    return sorted((replace(ev, ts=ev.ts + by) if isinstance(ev, SchedulerStep | SchedulerHello) else ev
                   for ev in events), key=lambda e: e.ts)


def digests(events: list[Event]) -> tuple[str, str, int]:
    """(results digest, final timeline digest, results emitted) of one exact-mode pass."""
    p = AttributionPipeline()
    h = hashlib.sha256()
    results = p.feed_all(events) + p.settle()
    for r in results:
        h.update(repr(r).encode())
    tl = hashlib.sha256(repr((p.timeline.outcomes(), p.timeline.preemptions())).encode())
    return h.hexdigest()[:16], tl.hexdigest()[:16], len(results)


def pass_cpu(events: list[Event]) -> float:
    c = time.process_time()
    p = AttributionPipeline()
    p.feed_all(events)
    p.settle()
    return time.process_time() - c


def reads_cpu(events: list[Event]) -> tuple[float, int]:
    """CPU of the timeline's outcomes read once a second of event time, and how many reads."""
    tl = EngineTimeline()
    spent, reads, due = 0.0, 0, None
    for ev in events:
        tl.feed(ev)
        if due is None or ev.ts >= due:
            due = ev.ts + 1.0
            tl.lifecycles()
            c = time.process_time()
            tl.outcomes()
            spent += time.process_time() - c
            reads += 1
    return spent, reads


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--late", type=float, default=3.0)
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()
    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    print(f"machine: {machine()}; {pinned}")
    for path in sorted(RECORDINGS.glob("*-steps")):
        events = list(ReplaySource(path, exact=True).events())
        for label, evs in (("as read", events), (f"plugin {args.late:g} s late", plugin_late(events, args.late))):
            results, timeline, n = digests(evs)
            print(f"{path.name} ({label}): {n} results, digest {results}, timeline {timeline}")
        passes = [pass_cpu(events) for _ in range(args.reps)]
        reads = [reads_cpu(events) for _ in range(args.reps)]
        print(f"{path.name}: pass CPU {min(passes):.3f} s, outcomes read {reads[0][1]} times: "
              f"{min(s for s, _ in reads) * 1000:.1f} ms CPU (least of {args.reps})")


if __name__ == "__main__":
    main()
