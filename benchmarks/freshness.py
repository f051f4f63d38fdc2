"""Freshness, live (issue #7, item 3): from a victim's span reaching the agent to its attribution being served.

    .venv/bin/python -m benchmarks.freshness                          # the five recordings once (~1.5 min)
    .venv/bin/python -m benchmarks.freshness --rounds 3 --json f.json # each three times (~4 min)
    .venv/bin/python -m benchmarks.freshness --recordings whale2 shorts

The real agent (`attrib-agent run`, its own process, on its own core when there are two) runs beside a
recording played live at its recorded pace (`attrib_agent.lab.playback`): a stand-in vLLM serves the recorded
/metrics bodies at their times, the recorded log lines are appended to the file the agent follows, and the
recorded OTLP exports are POSTed to its OTLP/HTTP port. Each recording is first moved to now (receipt times,
log stamps and span times by one whole number of seconds, `_recordings.CopyRewrite`) and given its own ids,
so the agent's receipt stamps and the stamps inside what it reads agree, as with a real vLLM beside it.

Right after an export is POSTed, every request whose `llm_request` span it carries is asked for at
`GET /v1/requests/{id}/culprits` every 10 ms (bounded), timed from the moment the POST began:
  first served  the first answer carrying its attribution: 200 (final) or 202 with a partial result (a 202
                `running`, before any result, does not count);
  final         the first 200 (status final). A result is final only once every request that overlapped it
                has landed, so this is also timed from when it *could* be final: the POST of the last span of
                the requests that arrived before it finished ("final after ready").
Polling runs at 100 ms while a partial result waits for others' spans, 10 ms otherwise. Goal: p99 <= 1 s
(first served, and final after ready). The agent's CPU (user + system, from /proc) is reported for the run.

What a user sees is timed from the request's end (its span's end, moved to now): "final (from its finish)",
goal p99 <= 1 s too. That includes vLLM's own span export delay, which the recordings hold as made (vLLM's
default OTel batch delay, `OTEL_BSP_SCHEDULE_DELAY` 5000 ms); `--span-delay-s 0.5` delivers each span alone that long
after it ended instead, about as a vLLM run with OTEL_BSP_SCHEDULE_DELAY=500 would.
`--gap-s 0` plays the copies back to back, without the idle gap between them (continuous traffic as far as
the recordings allow: each copy's own idle moments stay):

    .venv/bin/python -m benchmarks.freshness --gap-s 0 --span-delay-s 0.5 --rounds 2
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import gzip
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
import zlib
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import httpx
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

import attrib_agent
from attrib_agent.lab.playback import (
    Delivery,
    Due,
    LivePlayback,
    MetricsStandIn,
    Schedule,
    WallClock,
    lateness_s,
    otlp_spans,
    process_cpu_s,
    schedule,
)
from attrib_agent.lab.server import free_port
from attrib_agent.recording import LOG, METRICS, OTLP
from benchmarks._measure import machine, pin_one_core
from benchmarks._recordings import FIXTURES, CopyRewrite, SourceRecording, load_sources

PROTOBUF = "application/x-protobuf"
GOAL_P99_S = 1.0
POLL_S = 0.010
POLL_WAITING_S = 0.100  # a partial result whose overlapping requests have not all landed yet
MAX_WAIT_S = 15.0  # per request, for each of first served and final after ready
GAP_S = 2.0  # idle time between recordings
AGENT_START_S = 60.0


@dataclass
class Victim:
    request_id: str
    label: str  # recording and round
    arrived: float  # wall time the POST carrying its span began
    end_ts: float  # its span's end (moved to now): when the request finished
    ready: float | None = None  # when the last span of the requests that overlapped it was POSTed
    known: float | None = None  # first 200/202 of any kind
    served: float | None = None  # first answer with a result (partial or final)
    final: float | None = None
    polls: int = 0
    error: str | None = None


class Poller:
    """Asks the agent's API for each landed request until its final result, bounded in time."""

    def __init__(self, api: str, clock: WallClock) -> None:
        self.api = api
        self.clock = clock
        self.client = httpx.AsyncClient(trust_env=False, timeout=5.0,
                                        limits=httpx.Limits(max_connections=32, max_keepalive_connections=32))
        self.victims: list[Victim] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.landed: dict[str, float] = {}  # request id -> POST time of its span
        self.starts: dict[str, tuple[str, float]] = {}  # request id -> (label, span start) of every span played
        self.ends: dict[str, float] = {}  # request id -> its span's end

    def expect(self, label: str, records: Sequence[dict[str, Any]]) -> None:
        """The spans a recording will deliver: to know which requests overlap which."""
        for rec in records:
            for s in otlp_spans(rec):
                self.starts[s.request_id] = (label, s.start_ts)
                self.ends[s.request_id] = s.end_ts

    def landed_export(self, d: Delivery, label: str) -> None:
        if d.stream != OTLP:
            return
        for rid in d.request_ids:
            self.landed[rid] = d.sent_ts
        for rid in d.request_ids:
            v = Victim(rid, label, d.sent_ts, self.ends.get(rid, float("inf")))
            self.victims.append(v)
            self.tasks.append(asyncio.create_task(self._follow(v)))

    def _ready(self, v: Victim) -> float | None:
        """When every request of its recording that arrived before it finished had landed (None: not yet)."""
        times = [self.landed.get(rid) for rid, (label, start) in self.starts.items()
                 if label == v.label and start < v.end_ts]
        return None if any(t is None for t in times) else max((t for t in times if t is not None), default=v.arrived)

    async def _follow(self, v: Victim) -> None:
        url = f"{self.api}/v1/requests/{v.request_id}/culprits"
        deadline = v.arrived + MAX_WAIT_S
        while self.clock.now() < deadline:
            try:
                resp = await self.client.get(url)
            except httpx.HTTPError as e:
                v.error = f"{type(e).__name__}: {e}"[:200]
                await asyncio.sleep(POLL_S)
                continue
            now = self.clock.now()
            v.polls += 1
            status = resp.json().get("status") if resp.status_code in (200, 202) else None
            if status is not None and v.known is None:
                v.known = now
            if status in ("partial", "final") and v.served is None:
                v.served = now
            if status == "final":
                v.final = now
                return
            if v.ready is None:
                v.ready = self._ready(v)
                if v.ready is not None:
                    deadline = max(deadline, v.ready + MAX_WAIT_S)
            waiting = v.served is not None and v.ready is None
            await asyncio.sleep(POLL_WAITING_S if waiting else POLL_S)

    async def wait(self, timeout: float) -> None:
        if self.tasks:
            await asyncio.wait(self.tasks, timeout=timeout)
        for t in self.tasks:
            t.cancel()
        await self.client.aclose()


def start_agent(workdir: Path, metrics_url: str, log_file: Path, cpu: int | None,
                extra: Sequence[str] = (), launcher: Sequence[str] = ()) -> tuple[subprocess.Popen[bytes], str, str]:
    """`launcher`: the command that runs the agent's CLI instead of `attrib-agent` (a profiler's wrapper)."""
    api, otlp = free_port(), free_port()
    exe = Path(sys.executable).with_name("attrib-agent")
    cmd = [*(launcher or [str(exe) if exe.exists() else sys.executable,
                          *([] if exe.exists() else ["-m", "attrib_agent"])]),
           "run", "--vllm-url", metrics_url, "--log-file", str(log_file), "--otlp-http-port", str(otlp),
           "--otlp-grpc-port", "0", "--listen", f"127.0.0.1:{api}", "--no-nvml", "--metrics-interval-s", "0.25",
           *extra]

    def pin() -> None:
        if cpu is not None:
            os.sched_setaffinity(0, {cpu})

    # The agent runs the code this benchmark imported: the `attrib-agent` script alone would import the package
    # its environment was installed from (an editable install points at one checkout), not this worktree's.
    here = str(Path(attrib_agent.__file__).resolve().parents[1])
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p)}
    with (workdir / "agent.log").open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True, preexec_fn=pin,
                                env=env)
    api_url = f"http://127.0.0.1:{api}"
    deadline = time.monotonic() + AGENT_START_S
    with httpx.Client(trust_env=False, timeout=2.0) as c:
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                raise RuntimeError(f"attrib-agent exited with {proc.returncode}; see {workdir / 'agent.log'}")
            with contextlib.suppress(httpx.HTTPError):
                if c.get(f"{api_url}/healthz").status_code == 200:
                    return proc, api_url, f"http://127.0.0.1:{otlp}/v1/traces"
            time.sleep(0.1)
    stop_agent(proc)
    raise RuntimeError(f"attrib-agent did not answer /healthz within {AGENT_START_S:.0f} s")


def stop_agent(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # its own session: the agent and nothing else
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(10)


def prompt_exports(sched: Schedule, delay_s: float) -> Schedule:
    """Each span exported alone, `delay_s` after it ended (never later than recorded): about what vLLM's batch
    span processor does with OTEL_BSP_SCHEDULE_DELAY set to that delay (it batches the spans that end within
    one delay, so a real export may come up to `delay_s` earlier)."""
    due = []
    for d in sched.due:
        if d.stream != OTLP or d.record.get("content_type") != PROTOBUF:
            due.append(d)
            continue
        for body, end in _one_span_exports(base64.b64decode(d.record["body_b64"]), d.record.get("content_encoding")):
            at = min(d.at, end + delay_s)
            due.append(Due(at, OTLP, {**d.record, "ts": at, "body_b64": base64.b64encode(body).decode("ascii"),
                                      "content_encoding": None}))
    due.sort(key=lambda x: x.at)
    return Schedule(sched.shift_s, due[0].at, due[-1].at, due)


def _one_span_exports(body: bytes, encoding: str | None) -> list[tuple[bytes, float]]:
    """An OTLP/protobuf export split into one export per span (resource and scope kept), with each span's end."""
    if encoding == "gzip":
        body = gzip.decompress(body)
    elif encoding == "deflate":
        body = zlib.decompress(body)
    msg = ExportTraceServiceRequest()
    msg.ParseFromString(body)
    out = []
    for rs in msg.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                one = ExportTraceServiceRequest()
                r = one.resource_spans.add()
                r.resource.CopyFrom(rs.resource)
                sc = r.scope_spans.add()
                sc.scope.CopyFrom(ss.scope)
                sc.spans.add().CopyFrom(span)
                out.append((one.SerializeToString(), span.end_time_unix_nano / 1e9))
    return out


async def run(sources: list[SourceRecording], rounds: int, workdir: Path, agent_cpu: int | None,
              gap_s: float = GAP_S, span_delay_s: float | None = None) -> dict[str, Any]:
    clock = WallClock()
    standin = MetricsStandIn(clock)
    metrics_url = await standin.start()
    log_file = workdir / "vllm.log"
    log_file.touch()
    first = sources[0].records[METRICS][0]  # vLLM up and idle before the first recording: its first body
    standin.add([Due(0.0, METRICS, first)])
    proc, api, otlp_url = await asyncio.to_thread(start_agent, workdir, metrics_url, log_file, agent_cpu)
    poller = Poller(api, clock)
    deliveries: list[Delivery] = []
    per_recording: list[dict[str, Any]] = []
    try:
        cpu0, wall0 = process_cpu_s(proc.pid), clock.now()
        start_at = clock.now() + 0.5
        copy = 0
        for rnd in range(rounds):
            for src in sources:
                label = f"{src.path.name}#{rnd + 1}"
                k = copy

                def rewrite(shift: int, src: SourceRecording = src, k: int = k) -> Any:
                    return CopyRewrite(src.tag, k, shift).record

                sched = schedule(src.records, start_at, rewrite)
                if span_delay_s is not None:
                    sched = prompt_exports(sched, span_delay_s)
                copy += 1
                poller.expect(label, [dict(d.record) for d in sched.of(OTLP)])

                def on_delivery(d: Delivery, label: str = label) -> None:
                    poller.landed_export(d, label)

                player = LivePlayback(log_path=log_file, otlp_url=otlp_url, metrics=standin, clock=clock,
                                      on_delivery=on_delivery)
                print(f"{label}: {len(sched.due):,} records over {sched.end_ts - sched.start_ts:.1f} s "
                      f"(moved {sched.shift_s:+,} s)", file=sys.stderr, flush=True)
                cpu_before = process_cpu_s(proc.pid)
                got = await player.play(sched)
                deliveries += got
                bad = [d for d in got if d.stream == OTLP and d.status != 200]
                per_recording.append({"label": label, "records": len(sched.due), "otlp_failed": len(bad),
                                      "agent_cpu_s": process_cpu_s(proc.pid) - cpu_before,
                                      "lateness_s": {st: lateness_s(d for d in got if d.stream == st)
                                                     for st in (METRICS, LOG, OTLP)}})
                start_at = sched.end_ts + gap_s
        await poller.wait(MAX_WAIT_S * 2 + 5)
        for v in poller.victims:  # (one final at its first poll never had its ready time looked up)
            if v.ready is None:
                v.ready = poller._ready(v)
        cpu_s, wall_s = process_cpu_s(proc.pid) - cpu0, clock.now() - wall0
        agent_alive = proc.poll() is None
    finally:
        await standin.close()
        await asyncio.to_thread(stop_agent, proc)
    return {"victims": poller.victims, "per_recording": per_recording, "agent_cpu_s": cpu_s, "wall_s": wall_s,
            "player_lateness_s": lateness_s(deliveries), "scrapes": standin.scrapes, "agent_alive": agent_alive,
            "agent_exit": proc.returncode}


def pct(xs: Sequence[float], q: float) -> float:
    """Nearest-rank percentile of sorted `xs`."""
    if not xs:
        return float("nan")
    return xs[min(len(xs) - 1, max(0, int(q * len(xs) + 0.999999) - 1))]


def stats(values: list[float | None]) -> dict[str, Any]:
    got = sorted(v for v in values if v is not None)
    return {"n": len(got), "missing": len(values) - len(got), "p50_s": pct(got, 0.5), "p90_s": pct(got, 0.9),
            "p99_s": pct(got, 0.99), "max_s": got[-1] if got else float("nan")}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--recordings", nargs="+", default=None, metavar="NAME",
                    help="recordings under tests/fixtures/recordings (or paths); default all five")
    ap.add_argument("--rounds", type=int, default=1, help="play the recordings this many times (new ids each)")
    ap.add_argument("--agent-cpu", type=int, default=0, help="core for the agent (-1: do not pin)")
    ap.add_argument("--cpu", type=int, default=1, help="core for this process, the player and poller (-1: do not pin)")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (agent.log, vllm.log)")
    ap.add_argument("--json", default=None, metavar="FILE", help="write every figure here too")
    ap.add_argument("--event-time", action="store_true",
                    help="no agent process: replay through the pipeline, timed in event time (the rule's own delay, "
                         "free of this machine's load)")
    ap.add_argument("--gap-s", type=float, default=GAP_S, help="idle seconds between copies (0: back to back)")
    ap.add_argument("--span-delay-s", type=float, default=None, metavar="S",
                    help="deliver each OTLP export S after its last span ended (default: when recorded, i.e. "
                         "vLLM's default 5 s batch delay)")
    args = ap.parse_args(argv)
    if not 1 <= args.rounds <= 100:
        ap.error("--rounds must be from 1 to 100")
    if args.gap_s < 0 or (args.span_delay_s is not None and args.span_delay_s < 0):
        ap.error("--gap-s and --span-delay-s must be >= 0")
    paths = None if args.recordings is None else [
        p if Path(p).is_dir() else str(FIXTURES / p) for p in args.recordings]
    sources = load_sources(paths)
    if args.event_time:
        return event_time_report(sources, args.span_delay_s)
    two = (os.cpu_count() or 1) >= 2
    agent_cpu = args.agent_cpu if two and args.agent_cpu >= 0 else None
    pinned = pin_one_core(args.cpu if two and args.cpu >= 0 else None)
    print(f"machine: {machine()}\nplayer and poller: {pinned}; agent: "
          f"{'pinned to CPU ' + str(agent_cpu) if agent_cpu is not None else 'not pinned'}; recordings "
          f"{', '.join(s.path.name for s in sources)} x {args.rounds}", flush=True)
    workdir = Path(tempfile.mkdtemp(prefix="attrib-freshness-"))
    try:
        out = asyncio.run(run(sources, args.rounds, workdir, agent_cpu, args.gap_s, args.span_delay_s))
    finally:
        if not args.keep:
            for f in workdir.iterdir():
                f.unlink()
            workdir.rmdir()
        else:
            print(f"kept {workdir}", file=sys.stderr)
    return report(args, out)


def event_time_report(sources: list[SourceRecording], span_delay_s: float | None) -> int:
    """Request finished -> final result, in event time: each recording's events fed to the pipeline in receipt
    order (spans re-timed to `span_delay_s` after their end when given), the final result's time being the
    event time of the settle pass that emitted it. What the finalization rule costs, without CPU contention."""
    from attrib_agent.events import RequestSpan
    from attrib_agent.pipeline import AttributionPipeline
    from attrib_agent.sources.replay import ReplaySource

    lags: list[float | None] = []
    for src in sources:
        events = list(ReplaySource(src.path).events())
        if span_delay_s is not None:
            events = sorted((replace(e, ts=min(e.ts, e.end_ts + span_delay_s)) if isinstance(e, RequestSpan) else e
                             for e in events), key=lambda e: e.ts)
        p = AttributionPipeline()
        ends = {e.request_id: e.end_ts for e in events if isinstance(e, RequestSpan)}
        final: dict[str, float] = {}
        for ev in events:
            for r in p.feed(ev):
                if r.final and p.last_event_ts is not None:
                    final[r.request_id] = p.last_event_ts
        for r in p.settle():  # the recording ends: what is final by its last event (live, scrapes go on)
            if r.final and p.last_event_ts is not None:
                final[r.request_id] = p.last_event_ts
        mine = [final[rid] - end if rid in final else None for rid, end in ends.items()]
        r = stats(mine)
        print(f"{src.path.name:<10} n {r['n']:>3} missing {r['missing']}  p50 {r['p50_s']:.3f} s  "
              f"p99 {r['p99_s']:.3f} s")
        lags += mine
    r = stats(lags)
    delay = "as recorded (vLLM's default batch delay, up to 5 s)" if span_delay_s is None else f"{span_delay_s:g} s"
    ok = r["missing"] == 0 and r["p99_s"] <= GOAL_P99_S
    print(f"request finished -> final result, event time (span delay {delay}): n {r['n']}, p50 {r['p50_s']:.3f} s, "
          f"p99 {r['p99_s']:.3f} s, max {r['max_s']:.3f} s; goal p99 <= {GOAL_P99_S:g} s: "
          f"{'met' if ok else 'MISSED'} ({r['p99_s'] / GOAL_P99_S:.2f} x goal)")
    return 0


def report(args: argparse.Namespace, out: dict[str, Any]) -> int:
    vs: list[Victim] = out["victims"]
    rows = {
        "known (any 200/202)": stats([None if v.known is None else v.known - v.arrived for v in vs]),
        "first served": stats([None if v.served is None else v.served - v.arrived for v in vs]),
        "final (from its span)": stats([None if v.final is None else v.final - v.arrived for v in vs]),
        "final after ready": stats([None if v.final is None or v.ready is None else v.final - v.ready for v in vs]),
    }
    finished = stats([None if v.final is None else v.final - v.end_ts for v in vs])
    print(f"\n{'from the span POST to':<22} {'n':>4} {'missing':>7} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7} "
          f"{'max s':>7}")
    for name, r in rows.items():
        print(f"{name:<22} {r['n']:>4} {r['missing']:>7} {r['p50_s']:>7.3f} {r['p90_s']:>7.3f} {r['p99_s']:>7.3f} "
              f"{r['max_s']:>7.3f}")
    print(f"{'from its finish to':<22} {'n':>4} {'missing':>7} {'p50 s':>7} {'p90 s':>7} {'p99 s':>7} {'max s':>7}")
    print(f"{'final (freshness)':<22} {finished['n']:>4} {finished['missing']:>7} {finished['p50_s']:>7.3f} "
          f"{finished['p90_s']:>7.3f} {finished['p99_s']:>7.3f} {finished['max_s']:>7.3f}   span export delay: "
          + ("as recorded (vLLM's default, up to 5 s)" if args.span_delay_s is None
             else f"each span {args.span_delay_s:g} s after it ended"))
    rows["final (from its finish)"] = finished
    print(f"\n{'recording':<12} {'requests':>8} {'served p50 s':>12} {'served max s':>12} "
          f"{'final-after-ready max s':>24} {'agent CPU s':>11}  player late max ms (metrics/log/otlp)")
    for rec in out["per_recording"]:
        mine = [v for v in vs if v.label == rec["label"]]
        served = stats([None if v.served is None else v.served - v.arrived for v in mine])
        after = stats([None if v.final is None or v.ready is None else v.final - v.ready for v in mine])
        late = "/".join(f"{1000 * x:.0f}" for x in rec["lateness_s"].values())
        flag = "  (player late > 20 ms: inputs reached the agent late)" if max(rec["lateness_s"].values()) > 0.02 \
            else ""
        print(f"{rec['label']:<12} {len(mine):>8} {served['p50_s']:>12.3f} {served['max_s']:>12.3f} "
              f"{after['max_s']:>24.3f} {rec['agent_cpu_s']:>11.2f}  {late}{flag}")
    cpu, wall = out["agent_cpu_s"], out["wall_s"]
    polls = sum(v.polls for v in vs)
    failed = sum(r["otlp_failed"] for r in out["per_recording"])
    print(f"\nagent CPU {cpu:.1f} s in {wall:.1f} s ({cpu / wall:.0%} of a core; it also answered {polls:,} polls); "
          f"player lateness max {1000 * out['player_lateness_s']:.1f} ms; {out['scrapes']:,} /metrics scrapes; "
          f"OTLP POSTs failed {failed}; agent {'up to the end' if out['agent_alive'] else 'EXITED early'}")
    verdicts = {}
    for name in ("first served", "final after ready", "final (from its finish)"):
        r = rows[name]
        ok = r["missing"] == 0 and r["p99_s"] <= GOAL_P99_S
        verdicts[name] = "met" if ok else "MISSED"
        print(f"goal {name} p99 <= {GOAL_P99_S:g} s: {verdicts[name]} (p99 {r['p99_s']:.3f} s = "
              f"{r['p99_s'] / GOAL_P99_S:.2f} x goal, n {r['n']}" + (f", {r['missing']} never" if r["missing"] else "")
              + ")")
    if args.json:
        Path(args.json).write_text(json.dumps({
            "machine": machine(), "recordings": [r["label"] for r in out["per_recording"]], "rounds": args.rounds,
            "rows": rows, "agent_cpu_s": cpu, "wall_s": wall, "polls": polls,
            "player_lateness_s": out["player_lateness_s"], "per_recording": out["per_recording"],
            "goal_p99_s": GOAL_P99_S, "verdicts": verdicts, "gap_s": args.gap_s, "span_delay_s": args.span_delay_s,
            "victims": [v.__dict__ for v in vs]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
