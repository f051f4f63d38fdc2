"""What /metrics costs the pipeline thread at GPU rates (issue 14 item 3), in process, on the GPU-rate stream.

    .venv/bin/python -m benchmarks.metrics_render                          # 40,000 events, ahead 0 and 2.5 s
    .venv/bin/python -m benchmarks.metrics_render --events 20000 --ahead-s 2.5 --scrape-s 15

The stream's events are fed to an AgentCore as the live agent feeds them (inline here, one thread), at the share
floor the live benchmark's shedder reaches (0.01: passes 10 s of event time apart). Beside it, the agent's real
/metrics endpoint (`MetricsEndpoint`, its `Renderer`) runs on the stream's clock: the refresher ticks every
REFRESH_S of event time and a scraper GETs the body every `--scrape-s`. Every build of the pipeline part is timed
(thread CPU). One pass per `--ahead-s` value: 0 is how main rebuilt (at every tick where the state changed), the
agent's METRICS_AHEAD_S is what it does now. Printed per pass: builds, CPU in builds, per build median / p90 /
max, and the share of a core at the stream's pace (CPU in builds / event time).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from collections.abc import Callable
from itertools import islice
from typing import Any

from attrib_agent.agent.core import METRICS_AHEAD_S, METRICS_STALE_S, REFRESH_S, AgentCore
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.prometheus.collector import split_registries
from attrib_agent.sinks.prometheus.exposition import MetricsEndpoint
from attrib_agent.sources.replay import ReplaySource
from benchmarks._gpu_rate import cached_gpu_rate
from benchmarks._measure import machine

SHARE_FLOOR = 0.01
SCRAPE_HEADERS = [(b"accept", b"application/openmetrics-text; version=1.0.0"), (b"accept-encoding", b"gzip")]


async def one_pass(path: Any, events: int, ahead_s: float, scrape_s: float) -> dict[str, float]:
    core = AgentCore(AttributionPipeline(), threaded=False)
    p = core.pipeline
    p.attribute_share, p.pass_gap_s = SHARE_FLOOR, min(10.0, p.config.settle_interval_s / SHARE_FLOOR)
    now = [0.0]
    cpu: list[float] = []

    async def timed_read(fn: Callable[[], Any]) -> Any:
        t0 = time.thread_time()
        out = fn()
        cpu.append(time.thread_time() - t0)
        return out

    pipeline_part, live_part = split_registries(core.state)
    endpoint = MetricsEndpoint(pipeline_part, lambda: p.version, timed_read, max_age_s=None,
                               serve_stale_s=METRICS_STALE_S, ahead_s=ahead_s, live=live_part, clock=lambda: now[0])

    async def scrape() -> None:
        scope = {"type": "http", "method": "GET", "headers": SCRAPE_HEADERS, "query_string": b""}

        async def receive() -> Any:
            return {"type": "http.request"}

        async def send(message: Any) -> None:
            return None

        await endpoint(scope, receive, send)

    start = next_tick = next_scrape = None
    feed_cpu = 0.0
    for ev in islice(ReplaySource(path).events(), events):
        t0 = time.thread_time()
        core.process(ev)
        feed_cpu += time.thread_time() - t0
        now[0] = ev.ts
        if start is None:
            start, next_tick, next_scrape = ev.ts, ev.ts, ev.ts
        assert next_tick is not None and next_scrape is not None
        if ev.ts >= next_scrape:
            await scrape()
            next_scrape = ev.ts + scrape_s
        if ev.ts >= next_tick:
            await endpoint.renderer.refresh()
            next_tick = ev.ts + REFRESH_S
    span = now[0] - (start or 0.0)
    cpu.sort()
    return {"builds": len(cpu), "cpu_s": sum(cpu), "median_ms": statistics.median(cpu) * 1e3,
            "p90_ms": cpu[int(0.9 * (len(cpu) - 1))] * 1e3, "max_ms": cpu[-1] * 1e3, "span_s": span,
            "core": sum(cpu) / span, "feed_cpu_s": feed_cpu}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=40_000)
    ap.add_argument("--ahead-s", type=float, nargs="+", default=[0.0, METRICS_AHEAD_S])
    ap.add_argument("--scrape-s", type=float, default=5.0, help="seconds of event time between two scrapes")
    args = ap.parse_args(argv)
    info = cached_gpu_rate(600.0)
    print(f"{machine()}\nGPU-rate stream, first {args.events:,} events; a scrape every {args.scrape_s:g} s, the "
          f"refresher every {REFRESH_S:g} s of event time; share {SHARE_FLOOR}")
    for ahead in args.ahead_s:
        r = asyncio.run(one_pass(info.path, args.events, ahead, args.scrape_s))
        print(f"ahead_s {ahead:g}: {r['builds']:.0f} builds over {r['span_s']:.1f} s of event time, "
              f"{r['cpu_s']:.2f} s CPU (per build median {r['median_ms']:.1f} ms, p90 {r['p90_ms']:.1f}, "
              f"max {r['max_ms']:.1f}): {r['core']:.3f} core at the stream's pace; feeding {r['feed_cpu_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
