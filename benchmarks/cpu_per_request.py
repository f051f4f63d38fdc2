"""CPU per finished request as a never-idle busy period grows (issue 14 item 2; goal: flat, 30 min / 1 min <= 1.5).

A GPU server under steady load is never idle, so its busy period never closes: whatever the attribution does per
request must not grow with how long the engine has been busy. The committed recordings cannot show this (the
lab's runs are bursts with idle gaps, and copies of them are separated by idle gaps and vLLM restarts), so the
stream is generated: arrivals (shorts, long generations that overlap, a whale every `--whale-every-s`; seeded)
run through the attribution's own re-simulation of vLLM's scheduler (`scheduler_sim.simulate`, priced by the step-cost
prior), and every simulated step becomes the typed events vLLM's log, /metrics and OTLP spans would give: a
`Received request` and `Added request` per arrival, an `Iteration(N)` step line per step (prefill and decode
counts, elapsed time, KV usage), a /metrics snapshot a second, and the request's span shortly after it ends.
Those events go through the real `AttributionPipeline.feed`, on one pinned core; at each mark (1, 5, 10, 30
minutes of event time) the CPU spent over the minute before it is divided by the results made final in it, and
compared with the first mark's (goal: <= 1.5x), beside the re-simulation runs the run cache answered.

    .venv/bin/python -m benchmarks.cpu_per_request [--minutes 1,5,10,30] [--rate 3] [--cpu 1]
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_step import LiveRequest, StepPlan
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest
from attrib_agent.events import EngineStep, Event, MetricsSnapshot, RequestAdded, RequestReceived, RequestSpan
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from benchmarks._measure import machine, pin_one_core, rss_mb

GOAL_RATIO = 1.5
T0 = 1_800_000_000.0  # event time of the stream's start (any epoch-like second)


@dataclass(frozen=True)
class StreamConfig:
    minutes: float = 30.0
    rate_per_s: float = 3.0  # shorts a second (evenly spaced, sizes drawn)
    whale_every_s: float = 30.0
    long_every_s: float = 8.0  # a long generation (256-512 prompt, 1,500-2,500 output) this often
    block_size: int = 16
    num_blocks: int = 2048
    token_budget: int = 2048
    seed: int = 7


def arrivals(cfg: StreamConfig) -> list[SimRequest]:
    """Shorts (32-256 prompt, 32-128 output) at a steady rate, a long generation every `long_every_s` (so the
    engine is never idle), a whale (2-4k prompt, 200-400 output) every `whale_every_s`; ids like the lab's."""
    rng = random.Random(cfg.seed)
    out: list[SimRequest] = []
    span = cfg.minutes * 60.0
    n = int(span * cfg.rate_per_s)
    for i in range(n):
        out.append(SimRequest(f"cmpl-gen000-s{i:06d}-0", T0 + i / cfg.rate_per_s + rng.uniform(0, 0.05),
                              rng.randint(32, 256), rng.randint(32, 128)))
    for k in range(int(span / cfg.long_every_s) + 1):  # long generations overlapping each other: never idle
        out.append(SimRequest(f"cmpl-gen000-l{k:05d}-0", T0 + k * cfg.long_every_s, rng.randint(256, 512),
                              rng.randint(1500, 2500)))
    for k in range(int(span / cfg.whale_every_s)):
        out.append(SimRequest(f"cmpl-gen000-w{k:05d}-0", T0 + 5.0 + k * cfg.whale_every_s,
                              rng.randint(2000, 4000), rng.randint(200, 400)))
    return sorted(out, key=lambda r: r.arrival_ts)


def stream(cfg: StreamConfig) -> list[Event]:
    """The typed events of the simulated engine serving `arrivals(cfg)`, in receipt-time order."""
    sched = SchedulerConfig(block_size=cfg.block_size, num_blocks=cfg.num_blocks, token_budget=cfg.token_budget)
    reqs = arrivals(cfg)
    usable = cfg.num_blocks - 1
    events: list[Event] = []
    kv: list[tuple[float, float, int, int]] = []  # (end, usage, running, waiting) per step

    def on_step(plan: StepPlan, running: list[LiveRequest], start: float, end: float) -> None:
        prefill = [m for m in plan.members if not m.decode]
        usage = round(sum(r.blocks for r in running) / usable, 3)
        events.append(EngineStep(end + 0.001, end, 0, len(kv) + 1, len(prefill), sum(m.tokens for m in prefill),
                                 len(plan.members) - len(prefill), len(plan.members) - len(prefill),
                                 round((end - start) * 1000.0, 2), usage, "GPU"))
        kv.append((end, usage, len(running), 0))

    result = simulate(reqs, sched, StepCostModel(), on_step=on_step)
    for i, r in enumerate(reqs):
        o = result.outcomes[r.request_id]
        events.append(RequestReceived(r.arrival_ts, r.arrival_ts, r.request_id, r.output_tokens))
        events.append(RequestAdded(r.arrival_ts + 0.001, r.arrival_ts + 0.001, r.request_id, f"{r.request_id}-{i:08x}"))
        if o.finish_ts is None or o.first_token_ts is None or o.scheduled_ts is None:
            continue
        events.append(RequestSpan(
            o.finish_ts + 0.2, r.request_id, f"{i:032x}", f"{i:016x}", r.arrival_ts, o.finish_ts,
            o.scheduled_ts - r.arrival_ts, o.first_token_ts - r.arrival_ts, o.finish_ts - r.arrival_ts,
            o.first_token_ts - o.scheduled_ts, o.finish_ts - o.first_token_ts, o.finish_ts - o.scheduled_ts,
            r.prompt_tokens, len(o.token_ts), r.output_tokens))
    j = 0
    for s in range(int(cfg.minutes * 60.0) + 60):
        ts = T0 + s + 0.5
        while j + 1 < len(kv) and kv[j + 1][0] <= ts:
            j += 1
        usage = kv[j][1] if kv and kv[j][0] <= ts else 0.0
        events.append(MetricsSnapshot(ts, "0", "gen", None, None, usage, None, None, None, None, None, None, None,
                                      cfg.block_size, cfg.num_blocks))
    return sorted(events, key=lambda e: e.ts)


Row = tuple[float, float, int, dict[str, int]]


def measure(events: Sequence[Event], cfg: StreamConfig, marks: Sequence[float],
            on_mark: Callable[[Row], None] = lambda row: None) -> list[Row]:
    """(mark minutes, CPU seconds in the minute before it, results made final in it, what the timeline holds at
    the mark and the run cache's hits and misses so far) for each mark."""
    p = AttributionPipeline(PipelineConfig(block_size=cfg.block_size, num_blocks=cfg.num_blocks,
                                           token_budget=cfg.token_budget))
    out: list[Row] = []
    windows = sorted((T0 + 60.0 * (m - 1.0), T0 + 60.0 * m, m) for m in marks)
    k, cpu0, finals, runs0 = 0, None, 0, 0
    runs = p.attributor.runs
    for ev in events:
        while k < len(windows) and ev.ts >= windows[k][1]:
            out.append((windows[k][2], time.process_time() - cpu0 if cpu0 is not None else 0.0, finals,
                        {**p.timeline.sizes(), "run hits": runs.hits, "run misses": runs.misses,
                         "runs in the minute": runs.misses - runs0, "cost version": p.attributor.prices.version}))
            on_mark(out[-1])
            k, cpu0, finals = k + 1, None, 0
        if k == len(windows):
            break
        if cpu0 is None and ev.ts >= windows[k][0]:
            cpu0, runs0 = time.process_time(), runs.misses
        results = p.feed(ev)
        if cpu0 is not None:
            finals += sum(r.final for r in results)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", default="1,5,10,30", help="marks, minutes of event time")
    ap.add_argument("--rate", type=float, default=StreamConfig.rate_per_s, help="shorts a second")
    ap.add_argument("--whale-every-s", type=float, default=StreamConfig.whale_every_s)
    ap.add_argument("--cpu", type=int, default=1, help="core to pin to (-1: do not pin)")
    args = ap.parse_args(argv)
    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    marks = sorted(float(m) for m in args.minutes.split(","))
    cfg = StreamConfig(minutes=max(marks), rate_per_s=args.rate, whale_every_s=args.whale_every_s)
    t = time.process_time()
    events = stream(cfg)
    steps = sum(isinstance(e, EngineStep) for e in events)
    spans = sorted((e for e in events if isinstance(e, RequestSpan)), key=lambda s: s.start_ts)
    print(f"machine: {machine()}; {pinned}")
    print(f"stream: {len(events):,} events over {cfg.minutes:g} min of event time ({steps:,} steps, "
          f"{steps / (cfg.minutes * 60):.0f} steps/s; {len(spans):,} requests finished, "
          f"{len(spans) / (cfg.minutes * 60):.1f}/s); generated in {time.process_time() - t:.1f} CPU s")
    idle = [b.start_ts - a for a, b in zip(_ends(spans), spans[1:], strict=False) if b.start_ts > a]
    print(f"never idle: {'yes' if not idle else f'no ({len(idle)} gaps, longest {max(idle):.2f} s)'}", flush=True)
    firsts: list[float] = []

    def show(row: Row) -> None:
        m, cpu, n, held = row
        per = cpu / max(n, 1)
        firsts.append(per)
        ratio = per / firsts[0]
        print(f"busy {m:>4g} min: {n:5d} results final in the minute before, CPU {cpu:6.2f} s, "
              f"{per * 1000:7.2f} ms/request, {ratio:.2f}x the first (goal <= {GOAL_RATIO}: "
              f"{'met' if ratio <= GOAL_RATIO else 'MISSED'}), {held['runs in the minute'] / max(n, 1):.1f} runs "
              f"simulated a request; {held}", flush=True)

    rows = measure(events, cfg, marks, show)
    first = firsts[0]
    ratio = rows[-1][1] / max(rows[-1][2], 1) / first
    print(f"ratio {rows[-1][0]:g} min / {rows[0][0]:g} min: {ratio:.2f} (goal <= {GOAL_RATIO}: "
          f"{'met' if ratio <= GOAL_RATIO else 'MISSED'}); RSS {rss_mb():.0f} MB")
    return 0


def _ends(spans: list[RequestSpan]) -> list[float]:
    """Running maximum of the ends (the engine is idle before a span's start only if every earlier one ended)."""
    out, top = [], float("-inf")
    for s in sorted(spans, key=lambda s: s.start_ts):
        top = max(top, s.end_ts)
        out.append(top)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
