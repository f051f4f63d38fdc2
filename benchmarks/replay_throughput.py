"""Replay throughput (issue #7, item 2): a >= 1M-event recording through the full pipeline on one core.

    .venv/bin/python -m benchmarks.replay_throughput                 # 1M events (first run builds it, ~1 min)
    .venv/bin/python -m benchmarks.replay_throughput --events 50000  # the CI-sized variant
    .venv/bin/python -m benchmarks.replay_throughput --input gpu-rate [--duration 600] [--full-events N]
                                                    # issue 14: a never-idle GPU server's stream (_gpu_rate.py)

Three passes over the same built recording (see _recordings.py), each timed alone:
  raw     the records read and JSON-decoded (`Recording.records`, every input stream): the I/O floor
  decode  `ReplaySource.events()`: the records through the live parsers into typed events: the floor
  full    `ReplaySource.events()` -> `AttributionPipeline.feed`, then `settle()`: what the agent does
Goals: full >= 100,000 events/s and full >= 0.5 x decode. With `--input gpu-rate` the input's own rates are
printed first with their goals (issue 14 item 1), and `--full-events N` replays only its first N events through
the pipeline (the full pass over ten never-idle minutes does not end in reasonable time today).
Rates are per wall second of the pass and, in brackets, per CPU second (on a shared machine the pinned core is
not always ours).
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import json
import pstats
import sys
from itertools import islice
from pathlib import Path
from typing import Any

from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import Recording
from attrib_agent.sources.replay import ReplaySource
from benchmarks._gpu_rate import cached_gpu_rate, measure
from benchmarks._measure import Span, machine, peak_rss_mb, pin_one_core, pipeline_sizes, timed
from benchmarks._recordings import INPUT_STREAMS, cached_concatenation, default_cache_dir

GOAL_EVENTS_PER_S = 100_000
GOAL_FLOOR_RATIO = 0.5
GOAL_STEPS_PER_S = 100  # issue 14 item 1: a GPU server's rates, never idle, for >= 10 minutes
GOAL_FINISHED_PER_S = 50
GOAL_DURATION_S = 600
GOAL_MAX_IDLE_S = 0.1


def raw_pass(path: Path) -> int:
    rec = Recording(path)
    return sum(1 for s in INPUT_STREAMS for _ in rec.records(s))


def decode_pass(path: Path, limit: int | None = None) -> int:
    return sum(1 for _ in islice(ReplaySource(path).events(), limit))


def _goal(name: str, ok: bool, what: str) -> None:
    print(f"goal {name}: {'met' if ok else 'MISSED'} ({what})")


def gpu_rate_input(args: argparse.Namespace) -> tuple[Path, int]:
    """The GPU-rate recording (built once, cached) and its events; prints its rates against item 1's goals."""
    with timed() as build:
        info = cached_gpu_rate(args.duration, cache_dir=args.cache_dir)
    print(f"recording: {info.path}\n  {info.copies} time-compressed copies of bench-mixed/bench-prefix, "
          f"{sum(info.records.values()):,} records {info.records} (ready in {build.wall_s:.1f} s)")
    r = measure(info.path)
    print(f"  {r.events:,} events over {r.span_s:.0f} s of event time: {r.steps_per_s:,.0f} steps/s, "
          f"{r.finished_per_s:.1f} finished requests/s, longest idle {r.max_idle_s * 1000:.1f} ms, KV max "
          f"{r.kv_max:.2f} (>= 0.9 in {r.kv_near_full_share:.0%} of scrapes), {r.whales} whales, "
          f"{r.restarts} restarts")
    _goal(f"steps/s >= {GOAL_STEPS_PER_S}", r.steps_per_s >= GOAL_STEPS_PER_S, f"{r.steps_per_s:,.0f}")
    _goal(f"finished/s >= {GOAL_FINISHED_PER_S}", r.finished_per_s >= GOAL_FINISHED_PER_S, f"{r.finished_per_s:.1f}")
    _goal(f"never idle >= {GOAL_DURATION_S} s", r.span_s >= GOAL_DURATION_S and r.max_idle_s <= GOAL_MAX_IDLE_S,
          f"{r.span_s:.0f} s, longest idle {r.max_idle_s * 1000:.1f} ms")
    return info.path, r.events


def full_pass(path: Path, digest: Any | None = None, limit: int | None = None) -> tuple[int, AttributionPipeline]:
    """Every event fed (the first `limit`); with `digest` (a hashlib object), every result emitted goes into it."""
    p = AttributionPipeline()
    n = 0
    for ev in islice(ReplaySource(path).events(), limit):
        out = p.feed(ev)
        n += 1
        if digest is not None:
            for r in out:
                digest.update(repr(r).encode())
    for r in p.settle():
        if digest is not None:
            digest.update(repr(r).encode())
    return n, p


def _rate(n: int, span: Span) -> str:
    return f"{n / span.wall_s:>10,.0f}/s  ({n / span.cpu_s:,.0f}/s CPU)" if span.wall_s and span.cpu_s else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000, help="input events to build and replay (>=)")
    ap.add_argument("--cache-dir", type=Path, default=None, help=f"where built recordings live ({default_cache_dir()})")
    ap.add_argument("--cpu", type=int, default=1, help="core to pin to (-1: do not pin)")
    ap.add_argument("--profile", type=Path, default=None, help="also profile the full pass (cProfile) into this file")
    ap.add_argument("--digest", action="store_true", help="print a hash of every result emitted (same code, "
                                                          "same hash: checks an optimisation changed nothing)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures as JSON here too")
    ap.add_argument("--input", choices=("concat", "gpu-rate"), default="concat",
                    help="concat: the lab recordings back to back (issue 7); gpu-rate: a never-idle GPU server's "
                         "stream (issue 14, benchmarks/_gpu_rate.py)")
    ap.add_argument("--duration", type=float, default=GOAL_DURATION_S, help="gpu-rate: seconds of event time")
    ap.add_argument("--full-events", type=int, default=0, help="decode and full passes over the first N events only")
    args = ap.parse_args(argv)

    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    print(f"machine: {machine()}\n{pinned}")
    if args.input == "gpu-rate":
        path, n_built = gpu_rate_input(args)
    else:
        with timed() as build:
            info = cached_concatenation(args.events, cache_dir=args.cache_dir)
        print(f"recording: {info.path}\n  {info.copies} time-shifted copies, {info.events:,} events from "
              f"{sum(info.records.values()):,} records {info.records}, {info.span_s / 3600:.1f} h of receipt time "
              f"(ready in {build.wall_s:.1f} s)")
        path, n_built = info.path, info.events
    limit = args.full_events or None
    if limit is not None:
        n_built = min(n_built, limit)
        print(f"decode and full passes: the first {limit:,} events")

    with timed() as raw:
        n_raw = raw_pass(path)
    with timed() as dec:
        n_dec = decode_pass(path, limit)
    digest = hashlib.sha256() if args.digest else None
    prof = cProfile.Profile() if args.profile else None
    with timed() as full:
        if prof is not None:
            prof.enable()
        n_full, p = full_pass(path, digest, limit)
        if prof is not None:
            prof.disable()
    if n_dec != n_full or n_full != n_built:
        print(f"event counts differ: built {n_built}, decode {n_dec}, full {n_full}", file=sys.stderr)
        return 1

    ratio_wall = dec.wall_s / full.wall_s
    ratio_cpu = dec.cpu_s / full.cpu_s
    print(f"\n{'pass':<8}{'items':>12}{'wall s':>9}{'CPU s':>9}   rate (wall, CPU)          vs decode")
    print(f"{'raw':<8}{n_raw:>12,}{raw.wall_s:>9.1f}{raw.cpu_s:>9.1f}   {_rate(n_raw, raw)}  records")
    print(f"{'decode':<8}{n_dec:>12,}{dec.wall_s:>9.1f}{dec.cpu_s:>9.1f}   {_rate(n_dec, dec)}  1.00")
    print(f"{'full':<8}{n_full:>12,}{full.wall_s:>9.1f}{full.cpu_s:>9.1f}   {_rate(n_full, full)}  "
          f"{ratio_wall:.2f} (CPU {ratio_cpu:.2f})")
    pipeline_cpu_s = max(full.cpu_s - dec.cpu_s, 1e-9)
    print(f"\npipeline alone (full - decode): {pipeline_cpu_s:.1f} CPU s, {n_full / pipeline_cpu_s:,.0f} events/s; "
          f"results {len(p.store):,} in store, {sum(p.tally.requests.values()):,} final; "
          f"vLLM restarts seen {p.vllm_restarts}; peak RSS {peak_rss_mb():.0f} MB")
    print(f"sizes at the end: {pipeline_sizes(p)}")
    rate = n_full / full.wall_s
    decode_rate = n_dec / dec.wall_s
    _goal("events/s >= 100,000", rate >= GOAL_EVENTS_PER_S, f"{rate:,.0f}, {rate / GOAL_EVENTS_PER_S:.3f} x goal")
    _goal("full / decode >= 0.5", ratio_wall >= GOAL_FLOOR_RATIO,
          f"{ratio_wall:.2f}, {ratio_wall / GOAL_FLOOR_RATIO:.2f} x goal")
    _goal("decode floor >= 100,000 events/s (else the floor caps the goal)", decode_rate >= GOAL_EVENTS_PER_S,
          f"{decode_rate:,.0f}, {decode_rate / GOAL_EVENTS_PER_S:.3f} x goal")
    if digest is not None:
        print(f"results digest: {digest.hexdigest()[:16]}")
    if prof is not None:
        prof.dump_stats(args.profile)
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(15)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "input": args.input, "events": n_full, "records": n_raw,
            "raw": vars(raw), "decode": vars(dec), "full": vars(full),
            "events_per_s": rate, "floor_ratio": ratio_wall, "floor_ratio_cpu": ratio_cpu,
            "results": len(p.store), "peak_rss_mb": peak_rss_mb(), "digest": digest and digest.hexdigest(),
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
