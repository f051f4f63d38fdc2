"""CPU cost of each API endpoint and of a full garbage collection, in process (issue 14, item 5).

    .venv/bin/python -m benchmarks.api_cost                  # 100,000 results, 200 calls an endpoint, 3 full GCs
    .venv/bin/python -m benchmarks.api_cost --results 20000 --calls 50

`api_load` measures the latency a client sees; on a machine whose cores are shared with other jobs that figure
is mostly the scheduler's (the server waits for its core). This measures what the server itself spends: the
same store and timeline as `api_load` (100,000 results, one recording's steps), the agent's own ASGI app called
directly (no socket: `scope`/`receive`/`send`), CPU seconds (`time.process_time`) per call, and the CPU time of
`gc.collect()` (a full collection: the pause the event loop takes when the collector runs its oldest
generation), with and without the objects alive at start-up frozen (`AgentCore.serve` freezes them).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import random
import statistics
import time
from dataclasses import replace
from typing import Any

from benchmarks._measure import machine, pin_one_core, rss_mb

ENDPOINTS = ("culprits", "top_5m", "metrics", "timeline")


def _call(app: Any, path: str, query: str = "") -> int:
    """One GET through the ASGI app; returns the status."""
    status = 0

    async def receive() -> dict[str, Any]:
        return {"type": "http.request", "body": b"", "more_body": False}

    async def send(msg: dict[str, Any]) -> None:
        nonlocal status
        if msg["type"] == "http.response.start":
            status = msg["status"]

    scope = {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1", "method": "GET", "scheme": "http",
             "path": path, "raw_path": path.encode(), "query_string": query.encode(), "root_path": "",
             "headers": [(b"host", b"127.0.0.1"), (b"accept-encoding", b"gzip")], "client": ("127.0.0.1", 1),
             "server": ("127.0.0.1", 80)}
    _LOOP.run_until_complete(app(scope, receive, send))
    return status


_LOOP = asyncio.new_event_loop()


def _pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--results", type=int, default=100_000)
    ap.add_argument("--calls", type=int, default=200, help="calls of each endpoint")
    ap.add_argument("--gcs", type=int, default=3, help="full collections timed, before and after freezing")
    ap.add_argument("--cpu", type=int, default=1, help="core to pin to (-1: do not pin)")
    args = ap.parse_args(argv)
    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    print(f"machine: {machine()}\n{pinned}", flush=True)

    import attrib_agent.agent.core as core_mod
    from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
    from attrib_agent.sources.replay import ReplaySource
    from benchmarks._recordings import load_sources
    from benchmarks._results import base_results, fill_store

    sources = load_sources()
    live = max(sources, key=lambda s: s.events)
    p = AttributionPipeline(PipelineConfig(max_result_bytes=2**40))  # args.results, whatever the byte bound keeps
    spread = p.config.max_result_age_s - live.last_ts + live.first_ts - 60.0
    fill_store(p, base_results(), args.results,
               lambda i, r: replace(r, finished_ts=live.first_ts - spread + i * spread / args.results))
    for ev in ReplaySource(live.path).events():
        p.feed(ev)
    p.settle()
    core = core_mod.AgentCore(p)
    app = core.asgi_app(None)  # as the agent serves: bodies of an older state reused for up to a second
    stale_s, core_mod.READS_MAX_STALE_S = core_mod.READS_MAX_STALE_S, 0.0
    rebuilding = core.asgi_app(None)  # every change rebuilds: what each rebuild costs
    core_mod.READS_MAX_STALE_S = stale_s
    ids = [r.request_id for r in p.store]
    rng = random.Random(7)
    gc.collect()
    print(f"{len(p.store):,} results, {len(gc.get_objects()):,} objects tracked by the collector, "
          f"RSS {rss_mb():.0f} MB", flush=True)

    def full_gcs() -> list[float]:
        out = []
        for _ in range(args.gcs):
            c = time.process_time()
            gc.collect()
            out.append(time.process_time() - c)
        return out

    before = full_gcs()
    gc.freeze()
    after = full_gcs()
    gc.unfreeze()
    print(f"full gc.collect(), CPU ms: {', '.join(f'{1000 * x:.0f}' for x in before)} "
          f"(frozen start-up objects: {', '.join(f'{1000 * x:.1f}' for x in after)})")

    paths = {"culprits": lambda: (f"/v1/requests/{rng.choice(ids)}/culprits", ""),
             "top_5m": lambda: ("/v1/culprits/top", "window=5m"),
             "metrics": lambda: ("/metrics", ""),
             "timeline": lambda: ("/v1/timeline", "window=120")}
    gc.disable()  # the collector's pauses are measured above, not charged to whichever call they land in
    print(f"\n{'endpoint':<24}{'n':>6}{'p50 ms':>9}{'p99 ms':>9}{'max ms':>9}   CPU per call")
    rows = [(e, True, app) for e in ENDPOINTS] + [(e, True, rebuilding) for e in ("top_5m", "timeline")]
    for name, changed, served in rows + [(e, False, app) for e in ("top_5m", "metrics", "timeline")]:
        cpu = []
        for _ in range(args.calls):
            path, query = paths[name]()
            if changed:  # as if an event had been fed since the last call: nothing cached at this version
                p.version = getattr(p, "version", 0) + 1
            c = time.process_time()
            status = _call(served, path, query)
            cpu.append(time.process_time() - c)
            if status != 200:
                raise SystemExit(f"{name}: status {status}")
        label = name + ("" if changed else " (same state)") + (" (rebuilt)" if served is rebuilding else "")
        print(f"{label:<24}{len(cpu):>6}{1000 * statistics.median(cpu):>9.2f}{1000 * _pct(cpu, 0.99):>9.2f}"
              f"{1000 * max(cpu):>9.2f}")
    gc.enable()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
