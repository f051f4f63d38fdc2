"""Memory (issue #7, item 5): RSS with 100,000 retained results, with 2,000 requests in flight, and a soak.

    .venv/bin/python -m benchmarks.memory                   # all three, soak 60 s (~3 min in all)
    .venv/bin/python -m benchmarks.memory --duration 3600   # the hour-long soak
    .venv/bin/python -m benchmarks.memory --part soak       # one part: results | active | soak
    .venv/bin/python -m benchmarks.memory --part cost       # what a stored result costs, in what (~2 min)

Each part runs in a fresh process (so one's garbage does not count against the next), pinned to one core:
  results  real results (every recording replayed) copied with new ids through the result codec, so each
           copy owns its objects, into the pipeline's ResultStore up to 100,000
  active   2,000 requests in flight: the recordings' own Received/Added lines, steps and scrapes, copied
           with new ids and times (50 arrivals/s, no spans, so none finishes) into a fresh pipeline
  soak     replayed traffic (the live parsers on endless time-shifted copies) paced at 50 requests/s
           of wall time; RSS sampled every few seconds, its slope fitted after a warm-up
  cost     (on its own) 10,000 results of the GPU-rate input replayed and the recordings' results: bytes a
           result takes as objects, by part, against the store's packed form; JSON read back identical
RSS is VmRSS of /proc/self/status; the tracemalloc peak comes from a second run of the part under
tracemalloc (which slows it and adds its own overhead to RSS). Goal: <= 200 MB and no growth.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import subprocess
import sys
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable
from dataclasses import fields, replace
from typing import Any

from attrib_agent.attribution.result import AttributionResult, Culprit
from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.attribution.store import ResultStore
from attrib_agent.events import EngineStep, Event, MetricsSnapshot, RequestAdded, RequestReceived
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.recording import LOG
from attrib_agent.sinks.api.plumbing import dumps
from attrib_agent.sources.log.source import LogRecordParser
from attrib_agent.sources.replay import ReplaySource
from benchmarks._gpu_rate import cached_gpu_rate
from benchmarks._measure import machine, peak_rss_mb, pin_one_core, pipeline_sizes, rss_mb, timed
from benchmarks._recordings import SourceRecording, copy_tag, endless_replay, load_sources, round_rate
from benchmarks._results import base_results, copied_result, fill_store, real_results

__all__ = ["copied_result", "real_results"]  # (moved to _results; still importable from here)

GOAL_MB = 200.0


def agent_imports() -> str:
    """Import what the running agent imports, so RSS starts where the agent's does."""
    try:
        import attrib_agent.agent.core  # noqa: F401
    except ImportError as e:
        return f"pipeline only (attrib_agent.agent.core not importable: {e})"
    return "attrib_agent.agent.core"


def part_results(n: int) -> dict[str, Any]:
    base = base_results()
    p = AttributionPipeline(PipelineConfig(max_result_bytes=2**40))  # n results, whatever the byte bound would keep
    gc.collect()
    before = rss_mb()
    with timed() as fill:
        fill_store(p, base, n)
    gc.collect()
    after = rss_mb()
    culprits = sum(len(r.culprits) for r in p.store)
    return {"results": len(p.store), "culprits": culprits, "rss_before_mb": before, "rss_mb": after,
            "kb_per_result": (after - before) * 1024 / len(p.store), "fill_s": fill.wall_s,
            "counted_mb": getattr(p.store, "bytes", 0) / 2**20}  # (what the store counts: not on older commits)


def gpu_rate_results(n: int) -> list[AttributionResult]:
    """The first `n` results of the GPU-rate input replayed with every request attributed (as emitted: the last
    version of each)."""
    p = AttributionPipeline(PipelineConfig(max_results=10 * n, max_result_bytes=2**40))
    out: dict[str, AttributionResult] = {}
    for ev in ReplaySource(cached_gpu_rate(600.0).path).events():
        out.update((r.request_id, r) for r in p.feed(ev))
        if len(out) >= n:
            break
    return list(out.values())[:n]


def _walk(o: object, part: str, parts: Counter[str], seen: set[int]) -> None:
    """sys.getsizeof of `o` and what it holds, each object once, under `part` (or a part named by its field)."""
    if id(o) in seen:
        return
    seen.add(id(o))
    parts[part] += sys.getsizeof(o)
    if isinstance(o, AttributionResult):
        for f in fields(o):
            v = getattr(o, f.name)
            name = {"culprits": "culprits tuple", "evidence": "evidence map", "request_id": "request ids",
                    "trace_id": "span ids (text)", "span_id": "span ids (text)"}.get(f.name, "numbers")
            _walk(v, name, parts, seen)
    elif isinstance(o, tuple):
        for v in o:
            _walk(v, "culprit objects" if isinstance(v, Culprit) else part, parts, seen)
    elif isinstance(o, Culprit):
        _walk(o.request_id, "request ids", parts, seen)
        _walk(o._blob if o._blob is not None else o._raw, "culprit bytes", parts, seen)
    elif hasattr(o, "_blob"):
        _walk(o._blob, part, parts, seen)


def part_cost(n: int) -> dict[str, Any]:
    """What one stored result costs, and in what: the results as objects (a sys.getsizeof walk by part) against
    the store's packed form (its bytes, what it counts, tracemalloc over filling it); and every result read back
    from the store against the one put, as the API's JSON."""
    out: dict[str, Any] = {}
    for name, results in (("gpu_rate", gpu_rate_results(n)), ("lab", [r for _, r in real_results(load_sources())])):
        parts: Counter[str] = Counter()
        seen: set[int] = set()
        for r in results:
            _walk(r, "result object", parts, seen)
        store = ResultStore(max_results=len(results), max_bytes=2**40)
        gc.collect()
        tracemalloc.start()
        before = tracemalloc.get_traced_memory()[0]
        for r in results:
            store.put(r)
        gc.collect()
        traced = tracemalloc.get_traced_memory()[0] - before
        tracemalloc.stop()
        packed = [v for v in store._items.values() if type(v) is bytes]
        same = sum(dumps(to_dict(store.get(r.request_id) or r)) == dumps(to_dict(r)) for r in results)
        k = len(results)
        out[name] = {"results": k, "culprits": sum(len(r.culprits) for r in results) / k,
                     "objects_b": {p: v / k for p, v in parts.most_common()},
                     "objects_total_b": sum(parts.values()) / k,
                     "packed": len(packed), "packed_b": sum(sys.getsizeof(v) for v in packed) / max(len(packed), 1),
                     "counted_b": store.bytes / k, "traced_b": traced / k, "json_identical": same}
    return out


def _clone(ev: Event, k: int, tag: str, ts: float, log_ts: float | None) -> Event:
    rid = getattr(ev, "request_id", "").replace(f"-{tag}-", f"-{copy_tag(tag, k)}-")
    if isinstance(ev, RequestAdded):
        return replace(ev, ts=ts, log_ts=log_ts, request_id=rid,
                       internal_id=ev.internal_id.replace(f"-{tag}-", f"-{copy_tag(tag, k)}-"))
    if isinstance(ev, RequestReceived):
        return replace(ev, ts=ts, log_ts=log_ts, request_id=rid)
    return ev


def active_stream(sources: list[SourceRecording], n: int, rate: float) -> list[Event]:
    """`n` arrivals at `rate`/s (each a recorded Received + Added pair, retagged), with the recorded steps and
    scrapes between them, their times moved onto the new timeline; no span, so nobody finishes."""
    src = max(sources, key=lambda s: s.requests)
    events = list(ReplaySource(src.path).events())
    pairs = [(e, next(a for a in events if isinstance(a, RequestAdded) and a.request_id == e.request_id))
             for e in events if isinstance(e, RequestReceived)]
    steps = [e for e in events if isinstance(e, EngineStep)]
    scrapes = [e for e in events if isinstance(e, MetricsSnapshot)]
    t0 = events[0].ts
    step_dt = (steps[-1].ts - steps[0].ts) / (len(steps) - 1)
    out: list[Event] = []
    iteration = steps[0].iteration
    t, next_scrape, si = t0, t0, 0
    for i in range(n):
        received, added = pairs[i % len(pairs)]
        k = i // len(pairs)
        arrive = t0 + i / rate
        while t < arrive:  # the engine keeps stepping between arrivals, as recorded
            st = steps[si % len(steps)]
            out.append(replace(st, ts=t, log_ts=round(t, 3), iteration=iteration))
            iteration += 1
            si += 1
            if t >= next_scrape:
                out.append(replace(scrapes[si % len(scrapes)], ts=t))
                next_scrape += 0.25
            t += step_dt
        out.append(_clone(received, k, src.tag, arrive, round(arrive, 3)))
        out.append(_clone(added, k, src.tag, arrive + 0.001, round(arrive + 0.001, 3)))
    return sorted(out, key=lambda e: e.ts)  # (stable: a step and a scrape of one time keep their order)


def part_active(n: int) -> dict[str, Any]:
    stream = active_stream(load_sources(), n, rate=50.0)
    p = AttributionPipeline()
    gc.collect()
    before = rss_mb()
    with timed() as feed:
        for ev in stream:
            p.feed(ev)
        p.settle()
    del stream
    gc.collect()
    in_flight = sum(1 for lc in p.timeline.lifecycles() if lc.end_ts is None)
    return {"in_flight": in_flight, "rss_before_mb": before, "rss_mb": rss_mb(), "feed_s": feed.wall_s,
            "sizes": pipeline_sizes(p)}


def bounded_fills(p: AttributionPipeline, replay: ReplaySource) -> dict[str, tuple[int, int]]:
    """(held, bound) of the maps that fill with traffic up to a bound: until all are full RSS rises by design
    (at 50 requests/s the log parser's id maps take ~22 minutes), so only after that can a slope show a leak."""
    log = replay.parsers[LOG]
    assert isinstance(log, LogRecordParser)
    ids = log.line_parser.ids
    return {"log_parser_ids": (len(ids), 2 * ids.limit), "span_ids": (len(p._spans), p.config.max_pending),
            "results": (len(p.store), len(p.store) if p.store.evicted else p.config.max_results)}  # (by age)


def slope_mb_per_h(samples: list[tuple[float, float]]) -> float:
    xs, ys = [t for t, _ in samples], [m for _, m in samples]
    if len(xs) < 2 or max(xs) == min(xs):
        return 0.0
    return float(statistics.linear_regression(xs, ys).slope) * 3600


def part_soak(duration_s: float, rate: float, every_s: float, clock: Callable[[], float] = time.monotonic
              ) -> dict[str, Any]:
    """Paced replay. Receipt time runs `speed` x faster than wall time, so the store's age bound (an hour of
    receipt time) is reached after 3600 / speed wall seconds; a run too short for that gets a shorter age,
    reached within its first quarter (the warm-up, left out of the slope), so it is at steady state too."""
    sources = load_sources()
    req_rate, ev_rate = round_rate(sources, 5.0)
    speed = rate / req_rate  # receipt seconds replayed per wall second
    warm_up_s = duration_s / 4
    max_age_s = min(PipelineConfig().max_result_age_s, warm_up_s * speed)
    p = AttributionPipeline(PipelineConfig(max_result_age_s=max_age_s))
    samples: list[tuple[float, float]] = []
    lag_max = 0.0
    events = 0
    t0 = clock()
    next_sample = t0
    ts0: float | None = None
    print(f"soak: {rate:g} requests/s = {speed:.1f} x recorded time ({rate / req_rate * ev_rate:,.0f} events/s) "
          f"for {duration_s:g} s; results kept {max_age_s:.0f} s of receipt time ({max_age_s / speed:.0f} s of wall "
          f"time); RSS every {every_s:g} s", file=sys.stderr, flush=True)
    print(f"{'t s':>7} {'RSS MB':>8} {'results':>8} {'steps':>7} {'requests':>8} {'lag s':>6}", file=sys.stderr,
          flush=True)
    replay = endless_replay(sources)
    full_from: float | None = None  # when every bounded map below had filled up
    for ev in replay.events():
        ts0 = ev.ts if ts0 is None else ts0
        now = clock()
        ahead = t0 + (ev.ts - ts0) / speed - now
        if ahead > 0.005:
            time.sleep(ahead)
        else:
            lag_max = max(lag_max, -ahead)
        p.feed(ev)
        events += 1
        if now >= next_sample:
            mb = rss_mb()
            samples.append((now - t0, mb))
            fills = bounded_fills(p, replay)
            if full_from is None and all(n >= cap for n, cap in fills.values()):
                full_from = now - t0
            sz = p.timeline.sizes()
            print(f"{now - t0:>7.1f} {mb:>8.1f} {len(p.store):>8} {sz['steps']:>7} {sz['requests']:>8} "
                  f"{max(-ahead, 0.0):>6.2f}", file=sys.stderr, flush=True)
            next_sample += every_s
            if now - t0 >= duration_s:
                break
    steady_from = max(warm_up_s, full_from) if full_from is not None else None
    warm = [s for s in samples if steady_from is not None and s[0] >= steady_from]
    half = len(warm) // 2
    growth = statistics.fmean(m for _, m in warm[half:]) - statistics.fmean(m for _, m in warm[:half]) \
        if half else 0.0
    return {"duration_s": samples[-1][0], "events": events, "requests_per_s": rate, "speed": speed,
            "replayed_h": (ev.ts - (ts0 or ev.ts)) / 3600, "max_result_age_s": max_age_s, "warm_up_s": warm_up_s,
            "rss_max_mb": max(m for _, m in samples),
            "slope_mb_per_h": slope_mb_per_h(warm) if len(warm) >= 2 else None, "growth_mb": growth,
            "steady_from_s": steady_from, "fills": bounded_fills(p, replay), "lag_max_s": lag_max,
            "samples": samples, "sizes": pipeline_sizes(p)}


def run_part(args: argparse.Namespace) -> dict[str, Any]:
    imported = agent_imports()
    if args.tracemalloc:
        tracemalloc.start()
    if args.part == "results":
        out = part_results(args.results)
    elif args.part == "cost":
        out = part_cost(args.cost_results)
    elif args.part == "active":
        out = part_active(args.active)
    else:
        out = part_soak(args.duration, args.rate, args.sample_every)
    out["peak_rss_mb"] = peak_rss_mb()
    out["imports"] = imported
    if args.tracemalloc:
        out["tracemalloc_current_mb"], out["tracemalloc_peak_mb"] = (
            x / 2**20 for x in tracemalloc.get_traced_memory())
    return out


def _child(args: argparse.Namespace, part: str, trace: bool) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "benchmarks.memory", "--part", part, "--json-out", "-", "--results",
           str(args.results), "--active", str(args.active), "--duration", str(args.duration), "--rate",
           str(args.rate), "--sample-every", str(args.sample_every), "--cpu", str(args.cpu)]
    done = subprocess.run(cmd + (["--tracemalloc"] if trace else []), stdout=subprocess.PIPE, text=True, check=True)
    return dict(json.loads(done.stdout.splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--part", choices=("all", "results", "active", "soak", "base", "cost"), default="all")
    ap.add_argument("--results", type=int, default=100_000)
    ap.add_argument("--active", type=int, default=2_000)
    ap.add_argument("--cost-results", type=int, default=10_000, help="(part cost) GPU-rate results replayed")
    ap.add_argument("--duration", type=float, default=60.0, help="soak length, wall seconds")
    ap.add_argument("--rate", type=float, default=50.0, help="soak requests per wall second")
    ap.add_argument("--sample-every", type=float, default=5.0)
    ap.add_argument("--cpu", type=int, default=1, help="core to pin to (-1: do not pin)")
    ap.add_argument("--tracemalloc", action="store_true", help="(one part) trace Python allocations")
    ap.add_argument("--json-out", default=None, help="(one part) print the figures as one JSON line ('-')")
    args = ap.parse_args(argv)
    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    if args.part == "base":
        print(json.dumps([(tag, to_dict(r)) for tag, r in real_results(load_sources())]))
        return 0
    if args.part != "all":
        out = run_part(args)
        print(json.dumps(out) if args.json_out else json.dumps(out, indent=1), flush=True)
        return 0
    print(f"machine: {machine()}\n{pinned}; goal <= {GOAL_MB:g} MB RSS and no growth", flush=True)
    res = _child(args, "results", False)
    res_t = _child(args, "results", True)
    print(f"results: {res['results']:,} retained ({res['culprits']:,} culprits): RSS {res['rss_mb']:.0f} MB "
          f"(+{res['rss_mb'] - res['rss_before_mb']:.0f} MB, {res['kb_per_result']:.2f} KB each); tracemalloc "
          f"peak {res_t['tracemalloc_peak_mb']:.0f} MB; the store counts {res['counted_mb']:.1f} MB of them "
          f"(max_result_bytes {PipelineConfig().max_result_bytes / 2**20:g} MiB by default)", flush=True)
    act = _child(args, "active", False)
    act_t = _child(args, "active", True)
    print(f"active: {act['in_flight']:,} requests in flight: RSS {act['rss_mb']:.0f} MB "
          f"(+{act['rss_mb'] - act['rss_before_mb']:.0f} MB); tracemalloc peak {act_t['tracemalloc_peak_mb']:.0f} MB; "
          f"fed in {act['feed_s']:.1f} s; sizes {act['sizes']}", flush=True)
    soak = _child(args, "soak", False)
    fills = ", ".join(f"{k} {n:,}/{cap:,}" for k, (n, cap) in soak["fills"].items())
    if soak["slope_mb_per_h"] is None:
        growth = (f"not at steady state: bounded maps still filling ({fills}); run --duration 3600 "
                  f"for the slope")
    else:
        growth = (f"steady from {soak['steady_from_s']:.0f} s: slope {soak['slope_mb_per_h']:+.1f} MB/h, second "
                  f"half minus first {soak['growth_mb']:+.1f} MB")
    print(f"soak: {soak['duration_s']:.0f} s at {soak['requests_per_s']:g} requests/s ({soak['events']:,} events, "
          f"{soak['replayed_h']:.1f} h of recorded time): RSS max {soak['rss_max_mb']:.0f} MB; {growth}; "
          f"lag max {soak['lag_max_s']:.2f} s; sizes {soak['sizes']}", flush=True)
    worst = max(res["rss_mb"], act["rss_mb"], soak["rss_max_mb"])
    print(f"goal <= {GOAL_MB:g} MB: {'met' if worst <= GOAL_MB else 'MISSED'} (worst {worst:.0f} MB)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
