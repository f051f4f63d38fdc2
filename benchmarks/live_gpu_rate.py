"""Live at GPU rates (issue 14 item 3): the real `attrib-agent run` fed the GPU-rate stream at its own pace.

    .venv/bin/python -m benchmarks.live_gpu_rate                   # 60 s of the stream (~2 min)
    .venv/bin/python -m benchmarks.live_gpu_rate --duration 600    # the issue's 10 minutes

The stream is `benchmarks/_gpu_rate`'s (real continuous recordings, time-compressed to ~1,200 engine steps and
~60 finished requests a second, never idle; built once and cached), moved to now and played live through the
lab's playback: log lines appended to the file the agent follows, /metrics bodies from a stand-in vLLM, OTLP
exports POSTed to the agent's OTLP/HTTP port. The agent is its own process (`benchmarks.freshness.start_agent`),
on its own core when there are two.

Measured: the agent's CPU (user + system from /proc) and RSS every second; the time from a span's POST to its
final result (`GET /v1/requests/{id}/culprits` every 50 ms, at most 30 s) for every request the agent attributes
whatever its share (those its hash chooses at the share floor, ~1 % of them: the share starts at 1 and falls to the
floor within seconds at GPU rates, so a plain sample's final results would all come from the first seconds), with
how many were measured and their spread, also by 10 s of the stream, and one in `--sample` of the others (most
are shed: `skipped`); the backlog at the end (`attrib_pipeline_lag_seconds`, and requests still not final 30 s after
their span); the player's own lateness. Goals: <= 0.25 core mean, freshness p99 <= 1 s, RSS <= 200 MB and flat,
no backlog.
Log lines and /metrics bodies late by more than `LATE_GATE_S` make the run REJECTED: the machine, not the agent,
set its pace. OTLP exports are POSTed one after another, so an agent too busy to answer makes them late: that is
reported as the agent's backlog, not the player's. Playback stops `PLAY_GRACE_S` after the stream's end.
`--trace FILE` runs the agent under `benchmarks._traced_agent` and prints where each followed result's time went.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from attrib_agent.agent.shedding import MIN_SHARE
from attrib_agent.lab.playback import (
    Delivery,
    Due,
    LivePlayback,
    MetricsStandIn,
    Schedule,
    WallClock,
    lateness_s,
    process_cpu_s,
    read_streams,
    schedule,
)
from attrib_agent.lab.recording_copy import CopyRewrite
from attrib_agent.pipeline import chosen
from attrib_agent.recording import LOG, METRICS, OTLP
from benchmarks._gpu_rate import cached_gpu_rate
from benchmarks._measure import machine
from benchmarks._traced_agent import breakdown
from benchmarks.freshness import pct, start_agent, stop_agent

GOAL_CORES, GOAL_P99_S, GOAL_RSS_MB = 0.25, 1.0, 200.0
LATE_GATE_S = 0.5  # the player's worst lateness beyond which the run says nothing about the agent
PLAY_GRACE_S = 60.0  # how long past the stream's end OTLP exports may still be waiting on a busy agent
POLL_S, MAX_WAIT_S = 0.05, 30.0  # the follower sees a final result up to POLL_S late (half that on average)
SCRAPE_S = 5.0  # the backlog series are scraped this often during the run
RSS_WARMUP_S = 60.0  # the window and the fits fill in the first minute: RSS's slope is taken after it
BY_S = 10.0  # freshness is also shown by this much of the stream (the share starts at 1 and falls: a transient)
NO_TAG = "\x00"  # the GPU-rate ids are unique already: CopyRewrite only moves the times


@dataclass
class Sampled:
    request_id: str
    landed: float  # wall time its span's POST began
    final: float | None = None
    skipped: bool = False  # the agent shed it (status `skipped`): no result will come
    floor: bool = False  # chosen at the share floor: attributed whatever the share (the choice is nested)


class Follower:
    """Polls the API until final or skipped for every request the agent attributes whatever its share (chosen at
    the share floor: ~1 % of them) and one in `every` of the others (most of those are shed: `skipped`), 20 polls a
    second each: cheap enough not to load the agent. Only the first kind measures freshness whatever the share
    did; the second shows the start, while the share is still high."""

    def __init__(self, api: str, clock: WallClock, every: int) -> None:
        self.api, self.clock, self.every = api, clock, every
        self.client = httpx.AsyncClient(trust_env=False, timeout=5.0)
        self.sampled: list[Sampled] = []
        self.tasks: list[asyncio.Task[None]] = []
        self._seen = 0
        self.polls = 0  # GETs sent: the follower's own load on the agent (each one an API request)

    def landed(self, d: Delivery) -> None:
        if d.stream != OTLP:
            return
        for rid in d.request_ids:
            self._seen += 1
            floor = chosen(rid, MIN_SHARE)
            if floor or self._seen % self.every == 0:
                s = Sampled(rid, d.sent_ts, floor=floor)
                self.sampled.append(s)
                self.tasks.append(asyncio.create_task(self._follow(s)))

    async def _follow(self, s: Sampled) -> None:
        url = f"{self.api}/v1/requests/{s.request_id}/culprits"
        while self.clock.now() < s.landed + MAX_WAIT_S:
            try:
                self.polls += 1
                resp = await self.client.get(url)
                status = resp.json().get("status") if resp.status_code == 200 else None
                if status == "final":
                    s.final = self.clock.now()
                    return
                if status == "skipped":
                    s.skipped = True
                    return
            except httpx.HTTPError:
                pass
            await asyncio.sleep(POLL_S)

    async def wait(self) -> None:
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=MAX_WAIT_S + 5)
        await self.client.aclose()


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def thread_cpu_s(pid: int) -> dict[int, float]:
    """CPU seconds of each of the process's threads (the loop is the thread whose id is the pid)."""
    out: dict[int, float] = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError, ValueError):
            out[int(task.name)] = _task_cpu_s(task)
    return out


def _task_cpu_s(task: Path) -> float:
    fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


async def sample_process(pid: int, out: list[tuple[float, float, float]], stop: asyncio.Event,
                         threads: list[tuple[float, dict[int, float]]] | None = None) -> None:
    """(wall, cpu s, RSS MB) every second until `stop`; with `threads`, each thread's CPU too."""
    while not stop.is_set():
        out.append((time.monotonic(), process_cpu_s(pid), rss_mb(pid)))
        if threads is not None:
            threads.append((time.monotonic(), thread_cpu_s(pid)))
        try:
            await asyncio.wait_for(stop.wait(), 1.0)
        except TimeoutError:
            pass


async def watch_series(api: str, out: list[tuple[float, dict[str, float] | str]], stop: asyncio.Event) -> None:
    """The agent's backlog and shedding series every SCRAPE_S, as Prometheus would see them (or why not)."""
    async with httpx.AsyncClient(trust_env=False, timeout=SCRAPE_S) as c:
        while not stop.is_set():
            t0 = time.monotonic()
            try:
                out.append((t0, _series((await c.get(f"{api}/metrics")).text)))
            except httpx.HTTPError as e:
                out.append((t0, type(e).__name__))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), max(0.0, SCRAPE_S - (time.monotonic() - t0)))


async def run(path: Path, workdir: Path, every: int, agent_cpu: int | None, budget_cores: float,
              profile: tuple[str, Path] | None = None, trace: Path | None = None) -> dict[str, Any]:
    records = read_streams(path)
    clock = WallClock()
    standin = MetricsStandIn(clock)
    metrics_url = await standin.start()
    log_file = workdir / "vllm.log"
    log_file.touch()
    standin.add([Due(0.0, METRICS, records[METRICS][0])])
    proc, api, otlp_url = await asyncio.to_thread(start_agent, workdir, metrics_url, log_file, agent_cpu,
                                                  ["--attribution-budget-cores", str(budget_cores)],
                                                  [sys.executable, "-m", "benchmarks._profiled_agent", profile[0],
                                                   str(profile[1])] if profile else
                                                  [sys.executable, "-m", "benchmarks._traced_agent", str(trace)]
                                                  if trace else [])
    follower = Follower(api, clock, every)
    samples: list[tuple[float, float, float]] = []
    threads: list[tuple[float, dict[int, float]]] = []
    stop = asyncio.Event()
    try:
        def moved(lead_s: float) -> Schedule:
            return schedule(records, clock.now() + lead_s, lambda shift: CopyRewrite(NO_TAG, 0, shift, NO_TAG).record)

        t0 = clock.now()
        sched = moved(1.0)
        if sched.start_ts - clock.now() < 0.5:
            # Moving a long stream to now takes seconds (the 600 s one, ~800k records): its first deliveries were
            # due before it was built, and every 600 s run was rejected for a player ~2 s late at second 0.
            sched = moved(2.0 * (clock.now() - t0) + 1.0)
        print(f"playing {len(sched.due):,} records over {sched.end_ts - sched.start_ts:.0f} s", file=sys.stderr)
        sampler = asyncio.create_task(sample_process(proc.pid, samples, stop, threads))
        scrapes: list[tuple[float, dict[str, float] | str]] = []
        watcher = asyncio.create_task(watch_series(api, scrapes, stop))
        deliveries: list[Delivery] = []

        def delivered(d: Delivery) -> None:
            deliveries.append(d)
            follower.landed(d)

        player = LivePlayback(log_path=log_file, otlp_url=otlp_url, metrics=standin, clock=clock,
                              on_delivery=delivered)
        play = asyncio.create_task(player.play(sched))
        await asyncio.wait({play}, timeout=sched.end_ts - clock.now() + PLAY_GRACE_S)
        unplayed = 0 if play.done() else sum(1 for d in sched.due if d.stream == OTLP) - sum(
            1 for d in deliveries if d.stream == OTLP)
        play.cancel()
        played_at = time.monotonic()
        await follower.wait()
        lag: float | None = None
        series: dict[str, float] = {}
        try:
            async with httpx.AsyncClient(trust_env=False, timeout=5.0) as c:
                series = _series((await c.get(f"{api}/metrics")).text)
                lag = series.get("attrib_pipeline_lag_seconds")
        except httpx.HTTPError:
            pass
        stop.set()
        await sampler
        await watcher
        alive = proc.poll() is None
    finally:
        await standin.close()
        await asyncio.to_thread(stop_agent, proc)
    return {"deliveries": deliveries, "samples": samples, "threads": threads, "pid": proc.pid,
            "start_ts": sched.start_ts,
            "played_at": played_at, "sampled": follower.sampled, "polls": follower.polls,
            "lag_s": lag, "series": series, "scrapes": [(t - played_at, x) for t, x in scrapes], "alive": alive,
            "span_s": sched.end_ts - sched.start_ts,
            "otlp_unplayed": unplayed}


SERIES = ("attrib_pipeline_lag_seconds", "attrib_pipeline_backlog_events", "attrib_pipeline_backlog_seconds",
          "attrib_attributed_share_ratio", "attrib_victims_skipped_total", "attrib_results_stored",
          'attrib_slowed_outside_share_total{outcome="attributed"}',
          'attrib_slowed_outside_share_total{outcome="skipped"}')


def _series(text: str) -> dict[str, float]:
    """The unlabelled backlog and shedding series of one scrape (and the slowed taken outside the share)."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        name, _, value = line.partition(" ")
        if name in SERIES:
            out[name] = float(value.split()[0])
    return out


def summary(out: dict[str, Any]) -> dict[str, Any]:
    samples = [s for s in out["samples"] if s[0] <= out["played_at"]]  # while the stream played
    (t0, c0, _), (t1, c1, _) = samples[0], samples[-1]
    rss = [s[2] for s in samples]
    q = max(1, len(rss) // 4)
    warm = [(s[0] - t0, s[2]) for s in samples if s[0] - t0 >= RSS_WARMUP_S]  # after the first minute's fill
    finals = [s for s in out["sampled"] if s.final is not None]
    waits = sorted(s.final - s.landed for s in finals)
    floor = [s for s in out["sampled"] if s.floor]
    by: dict[int, list[float]] = {}
    for s in finals:
        by.setdefault(int((s.landed - out["start_ts"]) // BY_S), []).append(s.final - s.landed)
    played = [x for x in out["threads"] if x[0] <= out["played_at"]]
    (w0, th0), (w1, th1) = played[0], played[-1]
    per_thread = sorted(((tid, (th1[tid] - th0.get(tid, 0.0)) / (w1 - w0)) for tid in th1), key=lambda x: -x[1])
    return {
        "loop_cores": next((c for tid, c in per_thread if tid == out["pid"]), 0.0),
        "thread_cores": [c for tid, c in per_thread if tid != out["pid"] and c > 0.005],
        "cores_mean": (c1 - c0) / (t1 - t0), "rss_first_mb": rss[0], "rss_last_mb": rss[-1], "rss_peak_mb": max(rss),
        "rss_growth_mb": sum(rss[-q:]) / q - sum(rss[q:2 * q]) / q if len(rss) >= 4 else 0.0,  # last vs 2nd quarter
        "rss_slope_mb_min": statistics.linear_regression([t for t, _ in warm], [m for _, m in warm]).slope * 60
        if len(warm) >= 2 else float("nan"),
        "sampled": len(out["sampled"]), "polls": out["polls"], "final": len(waits),
        "skipped": sum(s.skipped for s in out["sampled"]),
        "floor": len(floor), "floor_final": sum(s.final is not None for s in floor),
        "floor_skipped": sum(s.skipped for s in floor),  # > 0: the benchmark's rule is not the agent's
        "fresh_p90_s": pct(waits, 0.9), "fresh_max_s": waits[-1] if waits else float("nan"),
        "fresh_by": {int(k * BY_S): [len(v), pct(sorted(v), 0.5), max(v)] for k, v in sorted(by.items())},
        "rss_every_30s": [round(x[2]) for x in samples[::30]],
        "end_series": out["series"], "scrapes": out["scrapes"], "rss_mean_mb": sum(rss) / len(rss),
        "fresh_p50_s": pct(waits, 0.5),
        "fresh_p99_s": pct(waits, 0.99), "lag_s": out["lag_s"], "otlp_unplayed": out["otlp_unplayed"],
        "player_late_s": lateness_s(d for d in out["deliveries"] if d.stream in (LOG, METRICS)),
        "otlp_late_s": lateness_s(d for d in out["deliveries"] if d.stream == OTLP),
        "player_late_worst": late_worst(out["deliveries"]),
        "span_s": out["span_s"], "alive": out["alive"],
    }


def late_worst(deliveries: list[Delivery], n: int = 5) -> list[tuple[str, float, float]]:
    """The player's latest deliveries (stream, seconds into the stream, lateness), and above all when: a rejected
    run says whether the player fell behind once (a pause of its own process) or drifted."""
    if not deliveries:
        return []
    start = min(d.due_ts for d in deliveries)
    worst = sorted((d for d in deliveries if d.stream in (LOG, METRICS)), key=lambda d: d.due_ts - d.sent_ts)[:n]
    return [(d.stream, round(d.due_ts - start, 1), round(d.sent_ts - d.due_ts, 3)) for d in worst]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of the GPU-rate stream to play")
    ap.add_argument("--sample", type=int, default=20,
                    help="besides those attributed whatever the share, follow one request in N")
    ap.add_argument("--agent-cpu", type=int, default=1, help="pin the agent to this core (-1: not pinned)")
    ap.add_argument("--budget-cores", type=float, default=GOAL_CORES,
                    help="the agent's attribution_budget_cores (default: the goal, as a capped sidecar would run)")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--profile", nargs=2, metavar=("cpu|mem", "DIR"),
                    help="run the agent under benchmarks._profiled_agent: cProfile per thread, or tracemalloc")
    ap.add_argument("--trace", type=Path, help="run the agent under benchmarks._traced_agent, its trace to this file")
    args = ap.parse_args(argv)
    info = cached_gpu_rate(args.duration)
    with tempfile.TemporaryDirectory(prefix="attrib-live-gpu-") as d:
        out = asyncio.run(run(info.path, Path(d), args.sample, None if args.agent_cpu < 0 else args.agent_cpu,
                              args.budget_cores, (args.profile[0], Path(args.profile[1])) if args.profile else None,
                              args.trace))
    s = summary(out)
    print(machine())
    rejected = s["player_late_s"] > LATE_GATE_S
    backlog = (s["final"] + s["skipped"] < s["sampled"] or s["lag_s"] is None or s["lag_s"] > GOAL_P99_S
               or s["otlp_unplayed"] > 0 or s["otlp_late_s"] > GOAL_P99_S)
    rows = [
        ("agent cores (mean)", f"{s['cores_mean']:.3f} (ratio {s['cores_mean'] / GOAL_CORES:.2f})",
         f"<= {GOAL_CORES}", s["cores_mean"] <= GOAL_CORES),
        ("freshness p99 (span -> final)", f"{s['fresh_p99_s']:.2f} s over {s['final']} final (p50 "
         f"{s['fresh_p50_s']:.2f}, p90 {s['fresh_p90_s']:.2f}, max {s['fresh_max_s']:.2f} s; ratio "
         f"{s['fresh_p99_s'] / GOAL_P99_S:.2f})", f"<= {GOAL_P99_S} s", s["fresh_p99_s"] <= GOAL_P99_S),
        ("RSS peak / growth", f"{s['rss_peak_mb']:.0f} MB / {s['rss_growth_mb']:+.1f} MB "
         f"(first {s['rss_first_mb']:.0f}, "
         f"mean {s['rss_mean_mb']:.0f}, last {s['rss_last_mb']:.0f}; ratio {s['rss_peak_mb'] / GOAL_RSS_MB:.2f})",
         f"<= {GOAL_RSS_MB:.0f} MB, flat", s["rss_peak_mb"] <= GOAL_RSS_MB and s["rss_growth_mb"] < 10),
        ("backlog", f"{s['sampled'] - s['final'] - s['skipped']} of {s['sampled']} not final after {MAX_WAIT_S:.0f} s; "
         f"lag {s['lag_s']} s; OTLP POSTs up to {s['otlp_late_s']:.2f} s late, {s['otlp_unplayed']} never sent",
         "none", not backlog),
    ]
    print(f"agent run with --attribution-budget-cores {args.budget_cores:g}")
    print(f"{s['span_s']:.0f} s of the GPU-rate stream, player late {s['player_late_s'] * 1000:.0f} ms at most "
          f"(gate {LATE_GATE_S * 1000:.0f} ms){' REJECTED' if rejected else ''}; agent alive: {s['alive']}")
    if rejected:
        print("  the player's latest deliveries (stream, s into the stream, late s): "
              + "; ".join(f"{st} {at:g} {late:g}" for st, at, late in s["player_late_worst"]))
    for name, got, goal, ok in rows:
        print(f"  {name:30s} {got:60s} goal {goal:18s} {'met' if ok else 'MISSED'}")
    print(f"  followed: {s['floor']} requests the agent attributes whatever its share (chosen at the floor "
          f"{MIN_SHARE:g}; {s['floor_final']} final, {s['floor_skipped']} skipped) and {s['sampled'] - s['floor']} "
          f"others, one in {args.sample} ({s['skipped'] - s['floor_skipped']} skipped: shed); final seen up to "
          f"{POLL_S * 1000:.0f} ms late (the poll)")
    print("  freshness by 10 s of the stream (n, p50, max): " + "; ".join(
        f"{t}-{t + int(BY_S)} s: {n}, {p50:.2f}, {mx:.2f}" for t, (n, p50, mx) in s["fresh_by"].items()))
    print(f"  agent cores by thread: loop {s['loop_cores']:.3f}, others "
          + ", ".join(f"{c:.3f}" for c in s["thread_cores"]) + " (the largest other: the pipeline thread); "
          f"the follower's own load: {s['polls']:,} API GETs")
    print("  RSS every 30 s while the stream played (MB): " + " ".join(str(x) for x in s["rss_every_30s"])
          + f"; slope after the first {RSS_WARMUP_S:.0f} s {s['rss_slope_mb_min']:+.2f} MB/min")
    print("  at the end: " + ", ".join(f"{k} {v:g}" for k, v in s["end_series"].items()))
    short = {"attrib_pipeline_backlog_events": "backlog", "attrib_pipeline_backlog_seconds": "waited_s",
             "attrib_attributed_share_ratio": "share", "attrib_victims_skipped_total": "skipped"}
    for t, x in s["scrapes"]:
        shown = x if isinstance(x, str) else " ".join(f"{short[k]} {v:.3g}" for k, v in x.items() if k in short)
        print(f"    scrape at {t:+6.1f} s from the stream's end: {shown}")
    if args.trace:
        for line in breakdown(json.loads(args.trace.read_text()),
                              [(x.request_id, x.landed, x.final) for x in out["sampled"] if x.final is not None]):
            print(line)
    if args.json:
        args.json.write_text(json.dumps(s, indent=1) + "\n")
    return 2 if rejected else 0


if __name__ == "__main__":
    sys.exit(main())
