"""RSS over a long GPU-rate run, in process, faster than real time (issue 14 item 3: RSS <= 200 MB and flat).

    .venv/bin/python -m benchmarks.rss_growth                      # 30 min of the stream (~4-6 min of CPU)
    .venv/bin/python -m benchmarks.rss_growth --tracemalloc        # + what grew, by line (~2x slower)

The GPU-rate stream (`benchmarks/_gpu_rate`, ~60 finished requests and ~1,200 engine steps a second, never idle)
goes through the same parsers and `AgentCore.process` as a replay does, in batches of 512 with the forecast refresh
after each (as the live pipeline thread runs them), with the attributed share fixed (`--share`, default the live
agent's floor) and the pass gap the shedder gives it. The log parser learns of each span as the live agent's does
(`agent.replay.tell_spans_to_log`). No I/O, so it needs no quiet machine: RSS is read from
/proc each minute of event time, with the sizes of the stores that hold per-request state. Printed: RSS per minute,
the slope after `--warmup` minutes (least squares) and the growth from the warm-up's end to the last minute, against
the goal (flat: < 10 MB from the warm-up's end to the end, the live benchmark's rule; <= 200 MB live, whose RSS is
~70 MB above this one's: its HTTP server, receivers and sinks). `--tracemalloc` adds the traced heap per minute and
the lines that grew most between the warm-up's end and the end.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
import tracemalloc
from collections.abc import Callable
from typing import Any

from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.replay import tell_spans_to_log
from attrib_agent.agent.shedding import MIN_SHARE, Shedder
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_codec import from_dict, to_dict
from attrib_agent.attribution.store import ResultStore
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import RequestSpan
from attrib_agent.pipeline import PipelineConfig
from attrib_agent.recording import LOG
from attrib_agent.sources.log.source import LogRecordParser
from attrib_agent.sources.replay import ReplaySource
from benchmarks._gpu_rate import cached_gpu_rate
from benchmarks._measure import machine, rss_mb

GOAL_GROWTH_MB = 10.0  # after the warm-up, over the rest of the run (the live benchmark's flatness rule)
BATCH = 512


def sizes(core: AgentCore, source: ReplaySource) -> dict[str, int]:
    """What holds per-request state now: the log parser's ids, the pipeline's maps, the store, the timeline."""
    p = core.pipeline
    log = source.parsers[LOG]
    ids = log.line_parser.ids if isinstance(log, LogRecordParser) else None
    return {"log_ids": len(ids) if ids is not None else -1, "spans": len(p._spans), "results": len(p.store),
            "received": len(core._received), "skipped": len(p._skipped),
            "requests": p.timeline.sizes()["requests"]}


def result_cost(results: list[AttributionResult]) -> tuple[float, float]:
    """(bytes a stored result costs, mean culprits a result): copies of `results` decoded afresh through the result
    codec (each owns its objects, as the pipeline's do) put into a new ResultStore under tracemalloc: the result,
    the store's entry and the culprit index's share."""
    if not results:
        return float("nan"), float("nan")
    dicts = [json.loads(json.dumps(to_dict(r))) for r in results]
    tracing = tracemalloc.is_tracing()
    if not tracing:
        tracemalloc.start(1)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0]
    store = ResultStore(max_results=len(dicts) + 1)
    for d in dicts:
        store.put(from_dict(d))
    gc.collect()
    cost = (tracemalloc.get_traced_memory()[0] - before) / len(dicts)
    if not tracing:
        tracemalloc.stop()
    return cost, sum(len(r.culprits) for r in results) / len(results)


def _hook(core: AgentCore, source: ReplaySource) -> Callable[[Any], None]:
    """The replay path's span wiring: the log parser told of each span as it arrives (agent/replay.py)."""
    tell_spans_to_log(core, source)

    def saw(ev: Any) -> None:
        if type(ev) is RequestSpan:
            core.span_arrived(ev)
    return saw


def run(duration_s: float, share: float, warmup_min: float, trace: bool) -> dict[str, Any]:
    source = ReplaySource(cached_gpu_rate(duration_s).path)
    core = AgentCore.from_config(AgentConfig(), live=False)
    p = core.pipeline
    shed = Shedder(0.25, share=share)
    p.attribute_share, p.pass_gap_s = shed.share, shed.pass_gap_s(p.config.settle_interval_s)
    saw = _hook(core, source)
    if trace:
        tracemalloc.start(1)
    rows: list[dict[str, Any]] = []
    mark: tracemalloc.Snapshot | None = None
    t0: float | None = None
    cpu0 = time.process_time()
    n = 0
    batch: list[Any] = []

    def flush() -> None:
        for ev in batch:
            saw(ev)
            core.process(ev)
        batch.clear()
        core.refresh_forecast()

    for ev in source.events():
        t0 = ev.ts if t0 is None else t0
        batch.append(ev)
        n += 1
        if len(batch) >= BATCH:
            flush()
            minute = (ev.ts - t0) / 60.0
            if minute >= len(rows):
                gc.collect()
                row = {"min": len(rows), "rss_mb": rss_mb(), "cpu_s": time.process_time() - cpu0, "events": n,
                       **sizes(core, source)}
                if trace:
                    row["traced_mb"] = tracemalloc.get_traced_memory()[0] / 2**20
                    if mark is None and len(rows) >= warmup_min:
                        mark = tracemalloc.take_snapshot()
                rows.append(row)
    flush()
    gc.collect()
    top: list[str] = []
    if trace and mark is not None:
        end = tracemalloc.take_snapshot()
        top = [str(s) for s in end.compare_to(mark, "lineno")[:12]]
        tracemalloc.stop()
    cost, culprits = result_cost(list(p.store))
    return {"rows": rows, "top": top, "result_bytes": cost, "culprits": culprits,
            "cpu_s": time.process_time() - cpu0, "events": n,
            "end_rss_mb": rss_mb(), "end": sizes(core, source), "results": len(p.store),
            "skipped": p.victims_skipped}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--duration", type=float, default=1800.0, help="seconds of the GPU-rate stream (event time)")
    ap.add_argument("--share", type=float, default=MIN_SHARE, help="the attributed share (live: the floor up)")
    ap.add_argument("--warmup", type=float, default=5.0, help="minutes left out of the slope (the fills)")
    ap.add_argument("--tracemalloc", action="store_true", help="also the traced heap and what grew, by line")
    args = ap.parse_args(argv)
    print(f"machine: {machine()}")
    out = run(args.duration, args.share, args.warmup, args.tracemalloc)
    rows = out["rows"]
    print(f"{out['events']:,} events, {len(rows) - 1} min of the stream at share {args.share:g}: "
          f"{out['cpu_s']:.0f} CPU s; {out['results']:,} results stored, {out['skipped']:,} skipped")
    keys = [k for k in rows[0] if k not in ("min", "cpu_s", "events")]
    print("  min " + " ".join(f"{k:>10s}" for k in keys))
    for r in rows:
        print(f"  {r['min']:3d} " + " ".join(f"{r[k]:10.1f}" if isinstance(r[k], float) else f"{r[k]:10d}"
                                          for k in keys))
    after = [r for r in rows if r["min"] >= args.warmup]
    if len(after) >= 2:
        slope = statistics.linear_regression([r["min"] for r in after], [r["rss_mb"] for r in after]).slope
        growth = after[-1]["rss_mb"] - after[0]["rss_mb"]
        peak = max(r["rss_mb"] for r in rows)
        ok = growth < GOAL_GROWTH_MB
        print(f"RSS after minute {args.warmup:g}: slope {slope * 60:+.2f} MB/h ({slope:+.3f} MB/min), "
              f"{after[0]['rss_mb']:.0f} -> {after[-1]['rss_mb']:.0f} MB ({growth:+.1f} MB over "
              f"{after[-1]['min'] - after[0]['min']} min), peak {peak:.0f} MB; goal flat (< {GOAL_GROWTH_MB:g} MB): "
              f"{'met' if ok else 'MISSED'}")
        if "traced_mb" in after[0]:
            print(f"traced heap after minute {args.warmup:g}: {after[0]['traced_mb']:.1f} -> "
                  f"{after[-1]['traced_mb']:.1f} MB")
    per_h = len(rows) > 1 and out["results"] / ((len(rows) - 1) / 60)
    print(f"a stored result costs {out['result_bytes']:,.0f} bytes (store entry and culprit index included; "
          f"{out['culprits']:.1f} culprits a result): {out['results']:,} results now, ~{per_h:,.0f} an hour at this "
          f"share (kept an hour: {per_h * out['result_bytes'] / 2**20:,.1f} MB); the count bound "
          f"{PipelineConfig().max_results:,}: {PipelineConfig().max_results * out['result_bytes'] / 2**20:,.0f} MB"
          + f"; the byte bound {(cap := PipelineConfig().max_result_bytes) / 2**20:g} MiB: "
            f"~{cap / out['result_bytes']:,.0f} results")
    for line in out["top"]:
        print("  grew: " + line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
