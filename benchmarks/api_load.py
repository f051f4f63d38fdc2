"""API under load (issue #7, item 4): the agent's HTTP API holding 100,000 results, at 200 requests/s.

    .venv/bin/python -m benchmarks.api_load                       # 200 requests/s for 60 s (~1.5 min in all)
    .venv/bin/python -m benchmarks.api_load --duration 10         # a short run
    .venv/bin/python -m benchmarks.api_load --rate 400 --json api.json

The server is the agent's own: `AgentCore.serve`, the uvicorn app `attrib-agent run` serves, on 127.0.0.1 (a
free port), in its own process. Its store holds 100,000 real-looking results (the committed recordings'
real results copied with new ids through the result codec, as the memory benchmark makes them, their finish
times spread over the hour the store keeps), and its timeline the steps of one recording replayed after them,
so `/v1/timeline` and `/v1/culprits/top?window=5m` have real content (~8,300 results in the 5 minutes).

The load generator is this process (another process than the server: it does not share its event loop), on
the other core when there are two. It is open-loop: request i is due at start + i / rate, whatever happened
to the ones before, and its latency counts from that *intended* time (no coordinated omission), over
keep-alive connections (raw asyncio sockets, HTTP/1.1; a new connection when all are busy, its connect time
counted). The mix: `GET /v1/requests/{id}/culprits` for random stored ids (90%) and for unknown ids (5%, 404
expected), `/v1/culprits/top?window=5m` (3%), `/metrics` (1%, with Prometheus' Accept and Accept-Encoding: gzip),
`/v1/timeline` as the page asks it (1%, with a browser's Accept-Encoding; `--plain` sends neither header).
The client measures its own lateness (send lag, and a 10 ms event-loop heartbeat); later than 20 ms, the run
is flagged as rejected, as the lab rejects its runs. Goal: p99 <= 5 ms over all requests.

The server reports (printed after the client's table) what it did itself, from the end of the warm-up: its
loop thread's CPU per request by endpoint (the thread CPU of each request's own steps through the app, and
the collections inside them, `_api_cpu.py`), the loop thread's CPU in all, its garbage collections, and how
late its own event loop fired a 10 ms timer: on a shared machine the wall latencies are mostly the
scheduler's, these are the server's. `--profile FILE`: cProfile of the server's loop thread in its own CPU
seconds (`time.thread_time`; a wall-clock profile on a shared machine charges the scheduler's preemptions to
whatever ran when they hit).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import random
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attrib_agent.lab.playback import process_cpu_s
from benchmarks._api_cpu import CpuTimer, report_server
from benchmarks._measure import machine, pin_one_core, rss_mb

GOAL_P99_MS = 5.0
MAX_LATENESS_S = 0.020  # as the lab: a client later than this cannot vouch for its latencies
HEARTBEAT_S = 0.010
REQUEST_TIMEOUT_S = 5.0
MAX_CONNECTIONS = 256
# endpoint name -> (share of requests, expected status). What a busy agent serves: "who slowed X" lookups from
# tooling and trace links (most of it, some for ids it does not know), dashboards and pages polling `top` and
# the timeline every few seconds, Prometheus scraping every 15 s. `--mix` measures any other.
MIX: dict[str, tuple[float, int]] = {"culprits": (0.90, 200), "culprits_unknown": (0.05, 404),
                                     "top_5m": (0.03, 200), "metrics": (0.01, 200), "timeline": (0.01, 200)}
# What the real callers send (`--plain`: none of it): Prometheus' scrape headers (its Accept, and gzip), a browser's
# page (`fetch` adds the browser's Accept-Encoding). The others go as curl or a script sends them.
CALLER_HEADERS: dict[str, str] = {
    "metrics": "Accept: application/openmetrics-text;version=1.0.0,application/openmetrics-text;version=0.0.1;"
               "q=0.75,text/plain;version=0.0.4;q=0.5,*/*;q=0.1\r\nAccept-Encoding: gzip\r\n",
    "timeline": "Accept: */*\r\nAccept-Encoding: gzip, deflate, br, zstd\r\n"}


# ---- the server (its own process) ------------------------------------------------------------------------
def serve(n_results: int, cpu: int | None, max_s: float, profile: str | None = None) -> int:
    """Build the store, serve it, print one JSON line (port, ids file) when listening; a line `measure` on stdin
    starts the measured part (CPU per request and the loop's CPU count from then); stop on stdin EOF."""
    import attrib_agent.agent.core as app  # the agent's imports, as `attrib-agent run` has them
    from attrib_agent.events import RequestSpan
    from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
    from attrib_agent.sources.replay import ReplaySource
    from benchmarks._recordings import load_sources
    from benchmarks._results import base_results, fill_store

    pinned = pin_one_core(cpu)
    sources = load_sources()
    live = max(sources, key=lambda s: s.events)  # replayed into the timeline after the copies: its end is "now"
    t_end = live.last_ts
    p = AttributionPipeline(PipelineConfig(max_result_bytes=2**40))  # n_results, whatever the byte bound keeps
    spread = p.config.max_result_age_s - live.last_ts + live.first_ts - 60.0

    def finish_in_the_hour(i: int, r: Any) -> Any:
        return replace(r, finished_ts=live.first_ts - spread + i * spread / n_results)

    t0 = time.perf_counter()
    fill_store(p, base_results(), n_results, finish_in_the_hour)
    spans = 0
    for ev in ReplaySource(live.path).events():
        p.feed(ev)
        spans += isinstance(ev, RequestSpan)
    p.settle()
    ids, window, culprits = [], 0, 0  # read once (the store decodes each result read): none kept
    for r in p.store:
        ids.append(r.request_id)
        window += r.finished_ts >= t_end - 300
        culprits += len(r.culprits)
    ids_file = Path(tempfile.mkstemp(prefix="api-load-ids-", suffix=".json")[1])
    ids_file.write_text(json.dumps(ids))
    timers: list[CpuTimer] = []

    class Timed(app.AgentCore):
        def asgi_app(self, token: str | None) -> Any:
            timers.append(CpuTimer(super().asgi_app(token)))
            return timers[-1]

    core = Timed(p, threaded=True)  # as `attrib-agent run` serves: reads on the pipeline thread
    prof = cProfile.Profile(time.thread_time) if profile else None  # CPU, not wall: see the docstring
    loop_cpu = [0.0, 0.0]  # the loop thread's CPU at `measure`, and at the end
    built_s = time.perf_counter() - t0
    gc.collect()  # the build's garbage, as a running agent would have collected it long before

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()

        def measure() -> None:  # on the loop: what came before (the warm-up) is not counted
            for t in timers:
                t.cpu.clear()
                t.gc_in.clear()
            pauses.clear()
            lags.clear()
            loop_cpu[0] = time.thread_time()
            if prof is not None:
                prof.enable()

        def on_eof() -> None:
            for line in sys.stdin:
                if line.strip() == "measure":
                    loop.call_soon_threadsafe(measure)
            loop.call_soon_threadsafe(stop.set)

        threading.Thread(target=on_eof, daemon=True).start()
        loop.call_later(max_s, stop.set)  # bounded, whatever the parent does

        def started(port: int) -> None:
            serving.append(True)
            print(json.dumps({"port": port, "ids_file": str(ids_file), "results": len(p.store),
                              "culprits": culprits, "in_5m": window,
                              "steps": p.timeline.sizes().get("steps"), "built_s": built_s, "rss_mb": rss_mb(),
                              "pinned": pinned, "pid": os.getpid()}), flush=True)

        async def loop_lag() -> None:  # the server's own event loop: how late a 10 ms timer fires
            while not stop.is_set():
                due = time.perf_counter() + HEARTBEAT_S
                await asyncio.sleep(HEARTBEAT_S)
                if serving:
                    lags.append(time.perf_counter() - due)

        lagging = asyncio.create_task(loop_lag())

        async def until_stop() -> None:
            await stop.wait()
            loop_cpu[1] = time.thread_time()
            if prof is not None:
                prof.disable()

        ending = asyncio.create_task(until_stop())
        await core.serve(app.ServeOptions("127.0.0.1", 0), stop, started)
        await lagging
        await ending

    pauses: list[tuple[int, float]] = []  # (generation, seconds) of every collection while serving
    began: list[float] = []
    serving: list[bool] = []  # (the start-up's own collection and freeze, before listening, are not counted)
    lags: list[float] = []

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            began.append(time.perf_counter())
        elif began:
            took = time.perf_counter() - began.pop()
            if serving:
                pauses.append((info["generation"], took))

    gc.callbacks.append(on_gc)
    try:
        asyncio.run(main())
    finally:
        gc.callbacks.remove(on_gc)
        ids_file.unlink(missing_ok=True)
        full = [s for g, s in pauses if g == 2]
        if prof is not None and profile:
            prof.dump_stats(profile)
        print(json.dumps({"loop_cpu_s": loop_cpu[1] - loop_cpu[0],
                          "cpu_per_request": timers[0].summary() if timers else {},
                          "gc": {"collections": len(pauses), "full": len(full),
                                 "full_max_ms": 1000 * max(full, default=0.0),
                                 "full_ms": [round(1000 * x, 2) for x in full[:20]],
                                 "young_max_ms": 1000 * max((s for g, s in pauses if g < 2), default=0.0)},
                          "server_loop_late_ms": {"p50": 1000 * pct(sorted(lags), 0.5) if lags else 0.0,
                                                  "p99": 1000 * pct(sorted(lags), 0.99) if lags else 0.0,
                                                  "max": 1000 * max(lags, default=0.0)}}), flush=True)
    return 0


# ---- the client ------------------------------------------------------------------------------------------
@dataclass
class Sample:
    endpoint: str
    intended: float  # monotonic
    sent: float = 0.0
    latency_s: float | None = None  # from the intended time to the last byte of the response
    status: int | None = None
    error: str | None = None
    new_connection: bool = False


class Conn:
    """One keep-alive HTTP/1.1 connection: a request at a time, Content-Length or chunked responses."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    @classmethod
    async def open(cls, port: int) -> Conn:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        return cls(reader, writer)

    async def get(self, path: str, headers: str = "") -> int:
        self.writer.write(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: keep-alive\r\n{headers}\r\n".encode())
        head = await self.reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ", 2)[1])
        headers = {k.strip().lower(): v.strip() for k, _, v in (ln.partition(":") for ln in lines[1:] if ln)}
        if "content-length" in headers:
            await self.reader.readexactly(int(headers["content-length"]))
        elif headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int((await self.reader.readuntil(b"\r\n")).split(b";")[0], 16)
                await self.reader.readexactly(size + 2)
                if size == 0:
                    break
        if headers.get("connection", "").lower() == "close":
            raise ConnectionResetError("server closed the connection")
        return status

    def close(self) -> None:
        self.writer.close()


@dataclass
class Plan:
    endpoint: str
    path: str
    offset_s: float
    headers: str = ""  # more request headers, each line ending in CRLF


def parse_mix(text: str) -> dict[str, tuple[float, int]]:
    """`culprits=80,top_5m=5,...` (percent, of the endpoints in MIX; those not named get 0)."""
    shares = {}
    for part in text.split(","):
        name, _, pc = part.partition("=")
        if name.strip() not in MIX:
            raise argparse.ArgumentTypeError(f"unknown endpoint {name!r}; known: {', '.join(MIX)}")
        shares[name.strip()] = float(pc) / 100
    if sum(shares.values()) <= 0:
        raise argparse.ArgumentTypeError("the mix must ask for something")
    total = sum(shares.values())
    return {k: (shares.get(k, 0.0) / total, expected) for k, (_, expected) in MIX.items()}


def make_plan(ids: Sequence[str], rate: float, duration_s: float, seed: int,
              mix: dict[str, tuple[float, int]] = MIX, headers: dict[str, str] = CALLER_HEADERS) -> list[Plan]:
    rnd = random.Random(seed)
    names = list(mix)
    weights = [mix[n][0] for n in names]
    plan = []
    for i in range(int(rate * duration_s)):
        name = rnd.choices(names, weights)[0]
        if name == "culprits":
            path = f"/v1/requests/{rnd.choice(ids)}/culprits"
        elif name == "culprits_unknown":
            path = f"/v1/requests/cmpl-unknown-{rnd.getrandbits(48):012x}-0/culprits"
        elif name == "top_5m":
            path = "/v1/culprits/top?window=5m"
        elif name == "metrics":
            path = "/metrics"
        else:
            path = "/v1/timeline"
        plan.append(Plan(name, path, i / rate, headers.get(name, "")))
    return plan


@dataclass
class LoadResult:
    samples: list[Sample]
    start: float
    end: float
    connections: int
    send_lag_max_s: float
    heartbeat_max_s: float
    heartbeat_p99_s: float
    heartbeat_top: list[tuple[float, float]] = field(default_factory=list)


async def run_load(port: int, plan: list[Plan], warm_up: list[Plan],
                   measuring: Callable[[], None] = lambda: None) -> LoadResult:
    idle: list[Conn] = []
    opened = 0

    async def one(s: Sample, path: str, headers: str, retry: bool = True) -> None:
        nonlocal opened
        conn = idle.pop(0) if idle else None  # (oldest first: it is the likeliest to have gone idle too long)
        reused = conn is not None
        try:
            if conn is None:
                if opened >= MAX_CONNECTIONS:
                    raise ConnectionError(f"more than {MAX_CONNECTIONS} connections busy")
                opened += 1
                s.new_connection = True
                conn = await asyncio.wait_for(Conn.open(port), REQUEST_TIMEOUT_S)
            s.sent = time.monotonic()
            s.status = await asyncio.wait_for(conn.get(path, headers), REQUEST_TIMEOUT_S)
            s.latency_s = time.monotonic() - s.intended
            idle.append(conn)
        except asyncio.IncompleteReadError as e:
            if conn is not None:
                conn.close()
                opened -= 1
            # The server closes a keep-alive connection idle for 5 s (uvicorn's default); a reused one that
            # answers nothing at all is that race, and a GET is retried on a new one, as HTTP clients do
            # (the time lost still counts: latency is from the intended time).
            if reused and retry and not e.partial:
                await one(s, path, headers, retry=False)
            else:
                s.error = f"{type(e).__name__}: {e}"[:200]
        except (OSError, TimeoutError, ValueError, IndexError) as e:
            s.error = f"{type(e).__name__}: {e}"[:200]
            if conn is not None:
                conn.close()
                opened -= 1

    for w in warm_up:  # the first call of each path pays lazy imports and caches: not measured
        await one(Sample(w.endpoint, time.monotonic()), w.path, w.headers)
    idle_conns = len(idle)
    measuring()  # the server counts its CPU from here
    loop = asyncio.get_running_loop()
    beats: list[tuple[float, float]] = []
    stop = asyncio.Event()

    async def heartbeat() -> None:
        while not stop.is_set():
            due = loop.time() + HEARTBEAT_S
            await asyncio.sleep(HEARTBEAT_S)
            beats.append((loop.time(), max(0.0, loop.time() - due)))

    hb = asyncio.create_task(heartbeat())
    start = time.monotonic() + 0.2
    samples: list[Sample] = []
    tasks: list[asyncio.Task[None]] = []
    lag_max = 0.0
    for pl in plan:
        due = start + pl.offset_s
        now = time.monotonic()
        if due > now:
            await asyncio.sleep(due - now)
        lag_max = max(lag_max, time.monotonic() - due)
        s = Sample(pl.endpoint, due)
        samples.append(s)
        tasks.append(asyncio.create_task(one(s, pl.path, pl.headers)))
    if tasks:
        await asyncio.wait(tasks, timeout=REQUEST_TIMEOUT_S + 1.0)
    end = time.monotonic()
    stop.set()
    await hb
    for c in idle:
        c.close()
    late = sorted(x for t, x in beats if start <= t <= end)
    top = sorted(((round(t - start, 3), x) for t, x in beats if start <= t <= end), key=lambda b: b[1])[-5:]
    return LoadResult(samples, start, end, max(opened, idle_conns), lag_max, late[-1] if late else 0.0,
                      pct(late, 0.99) if late else 0.0, top)


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted `xs`."""
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.999999) - 1))]


def summarise(samples: Sequence[Sample]) -> dict[str, Any]:
    lat = sorted(1000 * s.latency_s for s in samples if s.latency_s is not None)
    statuses = Counter(str(s.status) if s.status is not None else "error" for s in samples)
    return {"n": len(samples), "ok": len(lat), "p50_ms": pct(lat, 0.5), "p90_ms": pct(lat, 0.9),
            "p99_ms": pct(lat, 0.99), "max_ms": lat[-1] if lat else float("nan"), "statuses": dict(statuses)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rate", type=float, default=200.0, help="requests per second (open loop)")
    ap.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    ap.add_argument("--results", type=int, default=100_000, help="results in the server's store")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--mix", type=parse_mix, default=MIX, metavar="NAME=PCT,...",
                    help="request mix in percent, e.g. culprits=85,culprits_unknown=5,metrics=5,timeline=5 "
                         f"(default: {','.join(f'{k}={100 * v[0]:g}' for k, v in MIX.items())})")
    ap.add_argument("--server-cpu", type=int, default=0, help="core for the server (-1: do not pin)")
    ap.add_argument("--client-cpu", type=int, default=1, help="core for the client (-1: do not pin)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every figure here too")
    ap.add_argument("--plain", action="store_true",
                    help="send no Accept/Accept-Encoding (before 2026-11-26: /metrics and the timeline uncompressed)")
    ap.add_argument("--profile", default=None, metavar="FILE",
                    help="cProfile the server's event loop thread while measured, in thread CPU seconds (pstats file)")
    ap.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)  # the server's own process
    args = ap.parse_args(argv)
    if args.rate <= 0 or args.duration <= 0:
        ap.error("--rate and --duration must be > 0")
    if args.serve:
        return serve(args.results, None if args.server_cpu < 0 else args.server_cpu, args.duration + 600.0,
                     args.profile)
    two = (os.cpu_count() or 1) >= 2
    client_cpu = None if args.client_cpu < 0 or not two else args.client_cpu
    server_cpu = -1 if not two else args.server_cpu
    print(f"machine: {machine()}", flush=True)
    cmd = [sys.executable, "-m", "benchmarks.api_load", "--serve", "--results", str(args.results),
           "--server-cpu", str(server_cpu), "--duration", str(args.duration),
           *(["--profile", str(Path(args.profile).resolve())] if args.profile else [])]
    server = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert server.stdout is not None
        line = server.stdout.readline()  # the server prints one line when listening (or exits)
        if not line:
            print("the server exited before listening", file=sys.stderr)
            return 1
        info = json.loads(line)
        ids = json.loads(Path(info["ids_file"]).read_text())
        pinned = pin_one_core(client_cpu)
        print(f"server: pid {info['pid']}, {info['pinned']}; {info['results']:,} results "
              f"({info['culprits']:,} culprits; {info['in_5m']:,} finished in the last 5 minutes), "
              f"{info['steps']} steps in the timeline; built in {info['built_s']:.0f} s; RSS {info['rss_mb']:.0f} MB"
              f"\nclient: this process, {pinned}; open loop at {args.rate:g}/s for {args.duration:g} s; mix "
              + ", ".join(f"{k} {v[0]:.0%}" for k, v in args.mix.items()), flush=True)
        headers = {} if args.plain else CALLER_HEADERS
        plan = make_plan(ids, args.rate, args.duration, args.seed, args.mix, headers)
        warm = make_plan(ids, 100, 1.0, args.seed + 1, headers=headers)
        # each path at least once (100 can miss a 1 % one)
        for extra in make_plan(ids, 2000, 1.0, args.seed + 2, headers=headers):
            if extra.endpoint not in {w.endpoint for w in warm}:
                warm.append(extra)
        gc.collect()
        gc.disable()  # a collector pause here would read as server latency
        cpu0 = process_cpu_s(info["pid"])

        def measuring() -> None:
            assert server.stdin is not None
            server.stdin.write("measure\n")
            server.stdin.flush()

        res = asyncio.run(run_load(info["port"], plan, warm, measuring))
        server_cpu_s = process_cpu_s(info["pid"]) - cpu0
        gc.enable()
    finally:
        if server.stdin is not None:
            server.stdin.close()  # the server stops on EOF
        try:
            server.wait(30)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait(10)
    tail = server.stdout.read() if server.stdout is not None else ""
    inside = json.loads(tail.splitlines()[-1]) if tail.strip() else {}
    return report(args, res, server_cpu_s, inside)


def report(args: argparse.Namespace, res: LoadResult, server_cpu_s: float, inside: dict[str, Any]) -> int:
    wall = res.end - res.start
    by = {name: summarise([s for s in res.samples if s.endpoint == name]) for name in MIX if args.mix[name][0] > 0}
    overall = summarise(res.samples)
    bad = [s for s in res.samples if s.status != MIX[s.endpoint][1]]
    lateness = max(res.send_lag_max_s, res.heartbeat_max_s)
    accepted = lateness <= MAX_LATENESS_S
    done = [s for s in res.samples if s.latency_s is not None]
    last = max((s.intended + (s.latency_s or 0.0) for s in done), default=res.start)
    achieved = len(done) / max(1e-9, last - res.start)
    print(f"\n{'endpoint':<17} {'share':>5} {'n':>6} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>8}  statuses")
    for name, row in [*by.items(), ("all", overall)]:
        share = f"{args.mix[name][0]:.0%}" if name in MIX else ""
        print(f"{name:<17} {share:>5} {row['n']:>6} {row['p50_ms']:>7.2f} {row['p90_ms']:>7.2f} {row['p99_ms']:>7.2f} "
              f"{row['max_ms']:>8.2f}  {row['statuses']}")
    print(f"\nachieved {achieved:.1f} requests/s of {args.rate:g} asked ({len(done):,} answered of "
          f"{len(res.samples):,}); "
          f"errors (status not the expected one, or no answer) {len(bad)}; connections {res.connections}; "
          f"server CPU {server_cpu_s:.1f} s in {wall:.1f} s ({server_cpu_s / wall:.0%} of a core)")
    print(f"client lateness: send lag max {1000 * res.send_lag_max_s:.1f} ms, heartbeat max "
          f"{1000 * res.heartbeat_max_s:.1f} ms (p99 {1000 * res.heartbeat_p99_s:.1f} ms; worst at "
          f"{', '.join(f'{t:.1f}s' for t, _ in res.heartbeat_top[-3:])}): "
          + ("accepted" if accepted else f"REJECTED (> {1000 * MAX_LATENESS_S:.0f} ms: latencies not trustworthy)"))
    report_server(inside, len(res.samples), list(MIX))
    p99 = overall["p99_ms"]
    verdict = ("met" if p99 <= GOAL_P99_MS and not bad else "MISSED") if accepted else "REJECTED (client late)"
    print(f"goal p99 <= {GOAL_P99_MS:g} ms: {verdict} (p99 {p99:.2f} ms = {p99 / GOAL_P99_MS:.2f} x goal"
          + (f"; {len(bad)} errors" if bad else "") + ")")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine(), "rate": args.rate, "duration_s": args.duration, "results": args.results,
            "mix": args.mix, "endpoints": by, "overall": overall, "achieved_rate": achieved, "errors": len(bad),
            "error_examples": [s.error or s.status for s in bad[:5]], "connections": res.connections,
            "server_cpu_s": server_cpu_s, "wall_s": wall, "send_lag_max_s": res.send_lag_max_s,
            "heartbeat_max_s": res.heartbeat_max_s, "accepted": accepted, "goal_p99_ms": GOAL_P99_MS,
            "server": inside,
            "verdict": verdict}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        raise SystemExit(main())
