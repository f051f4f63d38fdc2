"""Forecast latency (issue 16, goal p99 <= 5 ms): one POST /v1/forecast's work, from the agent's state.

Each committed recording (and each kept truth run) is replayed through the pipeline; at every request's arrival
and every 50th engine step, the reference whale's forecast is timed as the endpoint does it (state read off the
timeline, cost model, both simulated futures): `--reps` times at each moment, on one pinned core. Printed: the
moments, p50/p99/max over all timings, the p99 of each rep round (its spread), and the same through the real
API (in-process ASGI, JSON in and out) for the arrival moments (the reference whale, then a new size), wall and
CPU, and how much of the difference the thread spent runnable but waiting for the core (the kernel's schedstat), and
where that CPU goes (the server's part, of it the forecast's, and the in-process client's). Then
the path the endpoint and gauge take, the agent's per-settle snapshot (`attribution/forecast_cache.py`), built
by the agent's loop after each settle (timed apart: off the request path), then a request for the candidate
already answered and for a new one (its own simulated run), CPU time; and a new one at the POSTs' moments, of
their sizes, called in turns with a POST: the forecast's own cost there, to compare with the forecast inside the
POST (the new-candidate line above is over every moment, steps too, of other sizes). The collector is run as in
the agent (survivors frozen every second, here of event time; `--no-gc-freeze`: left as it is, as runs before
2026-11-26's fourth session were): without it, a collection of the replay's unfrozen heap ran during 17 % of the
new-candidate POSTs.

    .venv/bin/python -m benchmarks.forecast_latency [--reps 5] [--cpu 1] [--horizon-s 10] [--no-gc-freeze]
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp, Receive, Scope, Send

from attrib_agent.agent.gc_freeze import GcFreezer
from attrib_agent.attribution.forecast import Candidate, ForecastConfig, ForecastSettings, forecast
from attrib_agent.attribution.forecast_state import engine_state, forecast_cost
from attrib_agent.events import EngineStep, RequestReceived
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sources.replay import ReplaySource
from benchmarks._measure import machine, pin_one_core

ROOT = Path(__file__).resolve().parents[1] / "tests" / "fixtures"
GOAL_MS = 5.0


def recordings() -> list[Path]:
    return sorted([*(ROOT / "recordings").iterdir(), *(ROOT / "truth").glob("*/runs/*")])


def pct(xs: list[float], q: float) -> float:
    s = sorted(xs)
    return s[min(len(s) - 1, int(q * len(s)))]


def _schedstat() -> tuple[float, float]:
    """(seconds on a CPU, seconds runnable but waiting for one) of this thread, from the kernel's scheduler
    statistics (zeros where /proc/thread-self/schedstat is missing)."""
    try:
        on, wait = Path("/proc/thread-self/schedstat").read_text().split()[:2]
    except (OSError, ValueError):
        return 0.0, 0.0
    return int(on) / 1e9, int(wait) / 1e9


class _Split:
    """Where a POST's thread CPU goes: the app's part (the server: routing, body, JSON, the forecast) and, inside
    it, `AgentState.forecast`'s; the rest is the in-process client's (httpx), which a real caller spends in its
    own process. Also the garbage collections that ran during the POST (their pauses are in the CPU time)."""

    def __init__(self, app: ASGIApp, state: AgentState) -> None:
        self.app, self.server, self.forecast = app, 0.0, 0.0
        inner = state.forecast

        def timed(*args: Any) -> Any:
            c = time.thread_time()
            try:
                return inner(*args)
            finally:
                self.forecast += time.thread_time() - c

        state.forecast = timed  # type: ignore[method-assign,assignment]  # the handler's call, timed

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        c = time.thread_time()
        try:
            await self.app(scope, receive, send)
        finally:
            self.server += time.thread_time() - c

    def reset(self) -> None:
        self.server, self.forecast = 0.0, 0.0


Post = tuple[float, float, float, float, float, int]
"""One POST: wall, thread CPU, run-queue wait, the server's CPU, the forecast's CPU, collections during it."""


async def _api(split: _Split, body: dict[str, int]) -> Post:
    """One POST through the real app in this thread (the pipeline's reads run inline without an agent): wall
    minus CPU is time this thread was not running; the CPU is split as `_Split` says."""
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=split), base_url="http://agent") as client:
        _, w = _schedstat()
        split.reset()
        collections = _collections()
        t, c = time.perf_counter(), time.thread_time()
        r = await client.post("/v1/forecast", json=body)
        dt, dc = time.perf_counter() - t, time.thread_time() - c
        collected = _collections() - collections
        dw = _schedstat()[1] - w
    r.raise_for_status()
    return dt, dc, dw, split.server, split.forecast, collected


def _event_clock(p: AttributionPipeline) -> Callable[[], float]:
    """The freezer's clock in the replay: the pipeline's event time (live, the loop's wall clock)."""
    return lambda: p.last_event_ts or 0.0


def _collections() -> int:
    return sum(g["collections"] for g in gc.get_stats())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--cpu", type=int, default=1)
    ap.add_argument("--horizon-s", type=float, default=ForecastConfig().horizon_s)
    ap.add_argument("--prompt-tokens", type=int, default=ForecastSettings().reference.prompt_tokens)
    ap.add_argument("--max-tokens", type=int, default=ForecastSettings().reference.max_tokens)
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="leave the collector as it is (before 2026-11-26's fourth session: every run did), instead "
                         "of freezing survivors every second of event time, as the agent does every second")
    args = ap.parse_args()
    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    cfg = ForecastConfig(horizon_s=args.horizon_s)
    ref = Candidate(args.prompt_tokens, args.max_tokens)
    rounds: list[list[float]] = [[] for _ in range(args.reps)]
    cpu: list[float] = []  # thread CPU seconds of the same timings: what other jobs on the core do not inflate
    api: list[Post] = []  # the reference whale (answered from the snapshot)
    api_new: list[Post] = []  # a new candidate (its own run)
    settle_build: list[float] = []  # CPU of the agent loop's work after each settle (AgentCore.refresh_forecast):
    #                                 state, the future without a candidate, the reference whale's run
    snap_hit: list[float] = []  # a candidate already answered from this settle's snapshot
    snap_other: list[float] = []  # a new candidate on the snapshot: its own run only
    same_moments: list[float] = []  # the same, at the POSTs' moments and of their sizes, outside a POST
    moments = 0
    for rec in recordings():
        p = AttributionPipeline()
        freezer = None if args.no_gc_freeze else GcFreezer(clock=_event_clock(p))
        state = AgentState(p, forecast_settings=ForecastSettings(cfg, ref))
        split = _Split(api_app(state), state)
        steps = 0
        for ev in ReplaySource(rec).events():
            steps += isinstance(ev, EngineStep)
            due = isinstance(ev, RequestReceived) or (isinstance(ev, EngineStep) and steps % 50 == 0)
            if due and p.last_event_ts is not None:
                moments += 1
                for r in rounds:
                    t, c = time.perf_counter(), time.thread_time()
                    now = engine_state(p)
                    assert now is not None
                    forecast(now, [ref], forecast_cost(p), cfg)
                    r.append(time.perf_counter() - t)
                    cpu.append(time.thread_time() - c)
                built = state.forecasts.built
                c = time.thread_time()
                state.forecast([ref])  # the endpoint's path: the snapshot the loop built after this settle
                snap_hit.append(time.thread_time() - c)
                assert state.forecasts.built == built, "the request built a snapshot: the loop's refresh is missing"
                c = time.thread_time()
                state.forecast([ref])
                snap_hit.append(time.thread_time() - c)
                c = time.thread_time()
                state.forecast([Candidate(ref.prompt_tokens // 2 + len(snap_other) % 7, ref.max_tokens)])
                snap_other.append(time.thread_time() - c)
                if isinstance(ev, RequestReceived):
                    api.append(asyncio.run(_api(split, {"prompt_tokens": ref.prompt_tokens,
                                                            "max_tokens": ref.max_tokens})))
                    # two sizes not yet asked on this snapshot, one through a POST and one called directly, the
                    # two swapped and taken in the other order at the next arrival: the forecast inside a POST
                    # against the same kind of call outside one, at the same moments
                    k = len(api_new)
                    sizes = [Candidate(ref.prompt_tokens // 3 + k % 7 + 7 * ((k + i) % 2), ref.max_tokens)
                             for i in (0, 1)]
                    for i in (0, 1) if k % 2 else (1, 0):
                        if i:
                            c = time.thread_time()
                            state.forecast([sizes[1]])
                            same_moments.append(time.thread_time() - c)
                        else:
                            api_new.append(asyncio.run(_api(split, {"prompt_tokens": sizes[0].prompt_tokens,
                                                                    "max_tokens": ref.max_tokens})))
            settles = p.settles
            p.feed(ev)
            if freezer is not None:  # the agent's loop freezes what survived every second (agent/gc_freeze.py)
                freezer.tick()
            if p.settles != settles and p.last_event_ts is not None:  # what the agent's loop does after a settle
                c = time.thread_time()
                state.refresh_reference()
                settle_build.append(time.thread_time() - c)
    every = [x for r in rounds for x in r]
    ms = 1000.0
    p99s = [pct(r, 0.99) * ms for r in rounds]
    print(f"machine: {machine()}; {pinned}; collector: "
          f"{'as it is' if args.no_gc_freeze else 'survivors frozen every second of event time, as the agent'}")
    print(f"reference whale {ref.prompt_tokens}/{ref.max_tokens}, horizon {args.horizon_s:g} s; "
          f"{moments} moments in {len(recordings())} recordings x {args.reps} reps")
    print(f"forecast (state + both futures): p50 {pct(every, 0.5) * ms:.2f} ms, p99 {pct(every, 0.99) * ms:.2f} ms"
          f" (per rep {min(p99s):.2f}-{max(p99s):.2f}), max {max(every) * ms:.2f} ms, mean "
          f"{statistics.fmean(every) * ms:.2f} ms; goal p99 <= {GOAL_MS:g} ms: "
          f"{'met' if pct(every, 0.99) * ms <= GOAL_MS else 'MISSED'}")
    print(f"  CPU time of the same: p50 {pct(cpu, 0.5) * ms:.2f} ms, p99 {pct(cpu, 0.99) * ms:.2f} ms, "
          f"max {max(cpu) * ms:.2f} ms")
    print(f"the agent loop's per-settle snapshot (off the request path; {len(settle_build)} settles), CPU: "
          f"p50 {pct(settle_build, 0.5) * ms:.2f} ms, p99 {pct(settle_build, 0.99) * ms:.2f} ms, "
          f"max {max(settle_build) * ms:.2f} ms")
    print(f"a request on it (AgentState.forecast), CPU: a candidate already answered (the reference whale) "
          f"p50 {pct(snap_hit, 0.5) * ms:.3f} ms, p99 {pct(snap_hit, 0.99) * ms:.3f} ms; a new candidate "
          f"p50 {pct(snap_other, 0.5) * ms:.2f} ms, p99 {pct(snap_other, 0.99) * ms:.2f} ms, "
          f"max {max(snap_other) * ms:.2f} ms; goal p99 <= {GOAL_MS:g} ms: "
          f"{'met' if pct(snap_other, 0.99) * ms <= GOAL_MS else 'MISSED'} for a new candidate")
    print(f"  the same at the arrivals, of the POSTs' sizes (taken in turns with a POST), CPU: p50 "
          f"{pct(same_moments, 0.5) * ms:.2f} ms, p99 {pct(same_moments, 0.99) * ms:.2f} ms, mean "
          f"{statistics.fmean(same_moments) * ms:.3f} ms (the forecast inside those POSTs: below)")
    for label, xs in (("the reference whale", api), ("a new candidate", api_new)):
        wall, cpu_, wait, server, fc = ([x[i] for x in xs] for i in range(5))
        gap = [x[0] - x[1] for x in xs]
        print(f"POST /v1/forecast in-process, {label} ({len(xs)} arrivals): wall p50 {pct(wall, 0.5) * ms:.2f} ms, "
              f"p99 {pct(wall, 0.99) * ms:.2f} ms, max {max(wall) * ms:.2f} ms; CPU p50 {pct(cpu_, 0.5) * ms:.2f} ms, "
              f"p99 {pct(cpu_, 0.99) * ms:.2f} ms; wall - CPU p50 {pct(gap, 0.5) * ms:.2f} ms, total "
              f"{sum(gap):.2f} s, of which waiting for a CPU (schedstat) {sum(wait):.2f} s")
        client = [x[1] - x[3] for x in xs]
        rest = [x[3] - x[4] for x in xs]
        collected = [x for x in xs if x[5]]
        print(f"  its CPU split: the server (the app) p50 {pct(server, 0.5) * ms:.2f} ms, p99 "
              f"{pct(server, 0.99) * ms:.2f} ms, of which the forecast p50 {pct(fc, 0.5) * ms:.2f} ms, p99 "
              f"{pct(fc, 0.99) * ms:.2f} ms, mean {statistics.fmean(fc) * ms:.3f} ms and the rest (routing, body, "
              f"JSON) p50 {pct(rest, 0.5) * ms:.2f} ms, "
              f"p99 {pct(rest, 0.99) * ms:.2f} ms; the in-process client p50 {pct(client, 0.5) * ms:.2f} ms, "
              f"p99 {pct(client, 0.99) * ms:.2f} ms; {len(collected)} POSTs saw a garbage collection"
              + (f" (their CPU p50 {pct([x[1] for x in collected], 0.5) * ms:.2f} ms)" if collected else ""))


if __name__ == "__main__":
    main()
