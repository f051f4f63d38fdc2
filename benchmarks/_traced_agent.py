"""`attrib-agent` with every request's path through it timed (wall clock), for `benchmarks.live_gpu_rate --trace`.

    python -m benchmarks._traced_agent OUT.json run --vllm-url ...   # then SIGTERM it like the agent

Wraps, in this process only, the points a finished request passes on its way to a final result: its span queued
(`AgentCore.submit`, on the loop, as the OTLP receiver hands it over), fed to the pipeline (`feed`, on the pipeline
thread), each attribution pass that takes it (`settle`: its event time, its wall start and end, final or partial and,
if partial, what it still waits for), and when the engine step that ends it was fed (the log line of its last step).
Also each batch and forecast refresh on the pipeline thread, to see what a span waited behind. At exit all of it is
written to OUT.json; `benchmarks.live_gpu_rate` joins it with what its follower saw. Costs a few us an event.
"""

from __future__ import annotations

import json
import sys
import threading
import time
from bisect import bisect_left
from pathlib import Path
from typing import Any

from attrib_agent.agent import core as core_mod
from attrib_agent.events import EngineStep, Event, RequestSpan
from attrib_agent.pipeline import AttributionPipeline

_spans: dict[str, dict[str, Any]] = {}  # request id -> its times
_passes: list[dict[str, Any]] = []  # each attribution pass that ran
_batches: list[tuple[float, float, int]] = []  # (wall start, wall end, events) of each pipeline batch
_forecasts: list[tuple[float, float, float]] = []  # (wall start, wall end, thread CPU) of each forecast refresh
_steps: list[tuple[float, float, float]] = []  # (log end stamp, receipt ts, wall fed) of each engine step
_shares: list[dict[str, Any]] = []  # the shedder after each batch that changed its share or its price
_lock = threading.Lock()


def _wrap() -> None:
    submit, feed, settle = core_mod.AgentCore.submit, AttributionPipeline.feed, AttributionPipeline.settle
    run_batch, refresh = core_mod.AgentCore._run_batch, core_mod.AgentCore.refresh_forecast

    def t_submit(self: core_mod.AgentCore, event: Event) -> None:
        if isinstance(event, RequestSpan):
            with _lock:
                _spans.setdefault(event.request_id, {})["queued"] = time.time()
        submit(self, event)

    def t_feed(self: AttributionPipeline, event: Event) -> Any:
        if isinstance(event, RequestSpan):
            with _lock:
                d = _spans.setdefault(event.request_id, {})
                d["fed"], d["ts"], d["end"] = time.time(), event.ts, event.end_ts
        elif isinstance(event, EngineStep) and not event.dummy:
            _steps.append((event.ts if event.log_ts is None else event.log_ts, event.ts, time.time()))
        return feed(self, event)

    def t_settle(self: AttributionPipeline) -> Any:
        before, t0, c0 = self._last_pass, time.time(), time.thread_time()
        out = settle(self)
        t1, cpu = time.time(), time.thread_time() - c0
        if self._last_pass is before:
            return out  # held back (shedding spacing): no pass ran
        now = self.last_event_ts
        waiting: dict[str, list[dict[str, Any]]] = {}
        if any(not r.final for r in out):
            lcs = {lc.request_id: lc for lc in self.timeline.lifecycles()}
            for r in out:
                if not r.final:
                    waiting[r.request_id] = [
                        {"id": b, "arrival": lcs[b].arrival_ts if b in lcs else None,
                         "end": lcs[b].end_ts if b in lcs else None,
                         "prompt": lcs[b].prompt_tokens if b in lcs else None}
                        for b in self._blockers(r.request_id, lcs, now, {r.request_id: r.mode})[:5]]
        _passes.append({"wall0": t0, "wall1": t1, "cpu": cpu, "now": now, "share": self.attribute_share,
                        "results": [[r.request_id, r.final] for r in out], "last_step_end":
                        self.timeline.last_step_end()})
        for r in out:
            with _lock:
                d = _spans.setdefault(r.request_id, {})
            d.setdefault("passes", []).append(
                {"wall0": t0, "wall1": t1, "now": now, "share": self.attribute_share, "final": r.final,
                 "finished": r.finished_ts, "waits_for": waiting.get(r.request_id)})
        return out

    def t_run_batch(self: core_mod.AgentCore, batch: list[tuple[float, Event]], deadline: float) -> int:
        t0 = time.time()
        n = run_batch(self, batch, deadline)
        _batches.append((t0, time.time(), n))
        shed = self.shedder
        if shed is not None:
            seen = (shed.share, self.pipeline.max_pass_victims, shed.affordable())
            if not _shares or seen != _shares[-1]["seen"]:
                _shares.append({"wall": t0, "seen": seen, "cores": shed.cores, "pass_cores": shed.pass_cores,
                                "spans_per_s": shed.spans_per_s, "cpu_one": shed.cpu.one()})
        return n

    def t_refresh(self: core_mod.AgentCore) -> None:
        settles, t0, c0 = self._forecast_settle, time.time(), time.thread_time()
        refresh(self)
        if self._forecast_settle != settles:
            _forecasts.append((t0, time.time(), time.thread_time() - c0))

    core_mod.AgentCore.submit = t_submit  # type: ignore[method-assign]
    AttributionPipeline.feed = t_feed  # type: ignore[method-assign]
    AttributionPipeline.settle = t_settle  # type: ignore[method-assign]
    core_mod.AgentCore._run_batch = t_run_batch  # type: ignore[method-assign]
    core_mod.AgentCore.refresh_forecast = t_refresh  # type: ignore[method-assign]


def _write(out: Path) -> None:
    steps = sorted(_steps)
    ends = [s[0] for s in steps]
    with _lock:
        spans = {rid: dict(d) for rid, d in _spans.items()}
    for d in spans.values():  # when the step that ends the request was fed (its last step's log line)
        end = d.get("end")
        i = bisect_left(ends, end) if end is not None else len(ends)
        if i < len(steps):
            d["last_step_fed"] = steps[i][2]
    out.write_text(json.dumps({"spans": spans, "passes": _passes, "batches": _batches, "forecasts": _forecasts,
                               "shares": _shares}))


STAGES = (
    ("POST -> queued", "receipt and decode on the loop"),
    ("queued -> fed", "behind the pipeline thread's batches, passes and forecast refreshes"),
    ("fed -> pass began", "waiting for a pass: the settle tick, the pass spacing, a partial result's blockers"),
    ("pass", "the pass that made it final, wall"),
    ("pass ended -> seen", "the follower's poll"),
)


def breakdown(trace: dict[str, Any], finals: list[tuple[str, float, float]]) -> list[str]:
    """Where each final result's time went, POST -> seen final, by stage (median and max over `finals`:
    (request id, POST wall time, wall time the follower saw it final)), and what its passes were."""
    rows: list[list[float]] = []
    partial = last_step_late = 0
    for rid, landed, seen in finals:
        d = trace["spans"].get(rid)
        done = [p for p in (d or {}).get("passes", []) if p["final"]]
        if d is None or "fed" not in d or not done:
            continue
        p = done[0]
        partial += len(d["passes"]) > 1
        last_step_late += d.get("last_step_fed", 0.0) > d["fed"]
        rows.append([d["queued"] - landed, d["fed"] - d["queued"], p["wall0"] - d["fed"], p["wall1"] - p["wall0"],
                     seen - p["wall1"], seen - landed])
    if not rows:
        return ["  trace: no final result followed"]
    out = [f"  trace of {len(rows)} final results followed (median / max, s); {partial} went partial first, "
           f"{last_step_late} had their last step's log line fed after their span:"]
    for i, (name, why) in enumerate([*STAGES, ("total", "POST -> seen final")]):
        xs = sorted(r[i] for r in rows)
        out.append(f"    {name:20s} {xs[len(xs) // 2]:6.3f} / {xs[-1]:6.3f}   {why}")
    passes = [p for p in trace["passes"] if p["results"]]
    cpu = sorted(p["cpu"] for p in passes)
    out.append(f"  passes with results: {len(passes)} (of {len(trace['passes'])} run), thread CPU median "
               f"{cpu[len(cpu) // 2] * 1000:.0f} ms, max {cpu[-1] * 1000:.0f} ms; forecast refreshes: "
               f"{len(trace['forecasts'])}, CPU max {max((f[2] for f in trace['forecasts']), default=0) * 1000:.0f} ms")
    return out


def main() -> int:
    out, cli_args = Path(sys.argv[1]), sys.argv[2:]
    _wrap()
    from attrib_agent.cli import main as cli_main

    try:
        return int(cli_main(cli_args) or 0)
    finally:
        _write(out)


if __name__ == "__main__":
    sys.exit(main())
