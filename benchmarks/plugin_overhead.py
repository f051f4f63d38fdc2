"""The step plugin's cost to vLLM: the same scenario on a lab without (A) and with (B) the plugin, ABAB...

    .venv/bin/python -m benchmarks.plugin_overhead                    # 3 pairs of the kvpair scenario (~6 min)
    .venv/bin/python -m benchmarks.plugin_overhead --reps 5 --scenario preempt --json plugin.json

Two labs run side by side (the plugin is chosen when vLLM starts), each idle while the other serves, so
alternating runs share the machine's drift. Per run, from the recording:
  - step period: mean time between consecutive `Iteration(N)` lines while vLLM is busy (gaps under 0.5 s),
    the whole engine loop (schedule, the plugin, the model, output processing): what the plugin would slow;
  - decode ITL: mean inter-token gap of every request, from the client's token stamps;
  - short-request TTFT p50, from the intended send time;
  - with the plugin, its own time on the engine thread per step (`cost_us` in each message).
Goal (issue 15): step rate with / without >= 0.99.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import tempfile
from contextlib import ExitStack
from pathlib import Path
from typing import Any

from attrib_agent.lab.record import record_run
from attrib_agent.lab.server import LabConfig, VllmLab
from attrib_agent.lab.summary import Spread, shorts, ttft_s
from attrib_agent.lab.workload import get_scenario
from attrib_agent.recording import CLIENT, LOG, VLLM_STEPS, Recording
from benchmarks._measure import machine

STAMP = re.compile(r" (\d{4}-\d{2}-\d{2} \d{2}:\d{2}:\d{2}\.\d{3}) .*Iteration\(\d+\)")
BUSY_GAP_S = 0.5

def step_period_s(rec: Recording) -> float:
    from datetime import datetime

    ts = [datetime.fromisoformat(m.group(1) + "+00:00").timestamp()
          for r in rec.records(LOG) if (m := STAMP.search(r["line"]))]
    gaps = [b - a for a, b in zip(ts, ts[1:], strict=False) if 0 <= b - a < BUSY_GAP_S]
    return statistics.fmean(gaps)


def run_figures(rec: Recording) -> dict[str, Any]:
    clients = list(rec.records(CLIENT))
    itl = [b - a for c in clients for a, b in zip(c["token_ts"], c["token_ts"][1:], strict=False)]
    ttfts = [t for r in shorts(clients) if (t := ttft_s(r)) is not None]
    out = {"step_period_ms": 1000 * step_period_s(rec), "itl_ms": 1000 * statistics.fmean(itl),
           "ttft_p50_ms": 1000 * statistics.median(ttfts), "preemptions": rec.meta.get("preemptions")}
    costs = [m["cost_us"] for m in rec.records(VLLM_STEPS) if m.get("kind") == "step"]
    if costs:
        out["plugin_cost_us_median"] = statistics.median(costs)
        out["plugin_cost_us_p99"] = sorted(costs)[int(0.99 * (len(costs) - 1))]
        out["plugin_drops"] = max(m.get("drops", 0) for m in rec.records(VLLM_STEPS))
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="benchmarks.plugin_overhead")
    p.add_argument("--reps", type=int, default=3, help="ABAB pairs (default %(default)s)")
    p.add_argument("--scenario", default="kvpair", help="a lab scenario (default %(default)s)")
    p.add_argument("--max-lateness-s", type=float, default=0.020)
    p.add_argument("--json", type=Path)
    args = p.parse_args(argv)
    scenario = get_scenario(args.scenario)
    runs: dict[str, list[dict[str, Any]]] = {"without": [], "with": []}
    with tempfile.TemporaryDirectory(prefix="plugin-overhead-") as tmp, ExitStack() as stack:
        root = Path(tmp)
        labs = {name: stack.enter_context(VllmLab(LabConfig(truth_plugin=(name == "with")), workdir=root / name))
                for name in ("without", "with")}
        for name, ep in labs.items():  # warm-up, unmeasured
            record_run(ep, scenario, root / f"warm-{name}", attempts=5, max_lateness_s=args.max_lateness_s)
        for rep in range(args.reps):
            for name, ep in labs.items():
                res = record_run(ep, scenario, root / f"{name}-{rep}", attempts=5, max_lateness_s=args.max_lateness_s)
                runs[name].append(run_figures(Recording(res.path)))
                print(name, rep, runs[name][-1], flush=True)
    summary = {k: {name: Spread.of(r[k] for r in runs[name]).as_dict() for name in runs}
               for k in ("step_period_ms", "itl_ms", "ttft_p50_ms")}
    ratio = summary["step_period_ms"]["without"]["mean"] / summary["step_period_ms"]["with"]["mean"]
    print(f"\n{machine()}\nscenario {scenario.name}, {args.reps} ABAB pairs")
    for k, per in summary.items():
        print(f"{k:<16} " + "   ".join(f"{n}: {s['mean']:.2f} ± {s['std']:.2f} [{s['min']:.2f}, {s['max']:.2f}]"
                                        for n, s in per.items()))
    costs = [r["plugin_cost_us_median"] for r in runs["with"]]
    print(f"plugin time on the engine thread per step: median of run medians {statistics.median(costs):.0f} us; "
          f"p99 up to {max(r['plugin_cost_us_p99'] for r in runs['with'])} us; drops "
          f"{sum(r['plugin_drops'] for r in runs['with'])}")
    print(f"step rate with / without: {ratio:.3f} (goal >= 0.99)")
    if args.json:
        args.json.write_text(json.dumps({"runs": runs, "summary": summary, "step_rate_ratio": ratio}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
