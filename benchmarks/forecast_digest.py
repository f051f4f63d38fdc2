"""A new candidate's forecast at every benchmark moment: its CPU time and a digest of every answer.

The moments of `benchmarks.forecast_latency` (each request's arrival and every 50th engine step of the committed
recordings and truth runs); at each, the state and the run without a candidate are built (the agent's per-settle
snapshot, untimed), then a new candidate's forecast is timed (CPU) and its answer hashed, with the per-request
extra TTFTs. A change meant to keep answers identical keeps the digest.

    .venv/bin/python -m benchmarks.forecast_digest [--cpu 0]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time

from attrib_agent.attribution.forecast import Candidate, ForecastConfig, ForecastSettings, baseline, forecast
from attrib_agent.attribution.forecast_state import engine_state, forecast_cost
from attrib_agent.events import EngineStep, RequestReceived
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource
from benchmarks._measure import machine, pin_one_core
from benchmarks.forecast_latency import pct, recordings


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cpu", type=int, default=0)
    args = ap.parse_args()
    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    cfg, ref = ForecastConfig(), ForecastSettings().reference
    digest = hashlib.sha256()
    cpu: list[float] = []
    for rec in recordings():
        p = AttributionPipeline()
        steps = 0
        for ev in ReplaySource(rec).events():
            steps += isinstance(ev, EngineStep)
            due = isinstance(ev, RequestReceived) or (isinstance(ev, EngineStep) and steps % 50 == 0)
            state = engine_state(p) if due and p.last_event_ts is not None else None
            if state is not None:
                cost = forecast_cost(p)
                base = baseline(state, cost, cfg)
                cand = Candidate(ref.prompt_tokens // 2 + len(cpu) % 7, ref.max_tokens)  # as forecast_latency's
                c = time.thread_time()
                f = forecast(state, [cand], cost, cfg, base)[0]
                cpu.append(time.thread_time() - c)
                digest.update(json.dumps(f.as_dict(), sort_keys=True).encode())
                digest.update(repr((f.in_flight.ttft_extra_by_request, f.expected.ttft_extra_by_request)).encode())
            p.feed(ev)
    ms = 1000.0
    print(f"machine: {machine()}; {pinned}")
    print(f"a new candidate's forecast on the snapshot, {len(cpu)} moments, CPU: p50 {pct(cpu, 0.5) * ms:.2f} ms, "
          f"p90 {pct(cpu, 0.9) * ms:.2f} ms, p99 {pct(cpu, 0.99) * ms:.2f} ms, max {max(cpu) * ms:.2f} ms, "
          f"total {sum(cpu):.2f} s; answers digest {digest.hexdigest()[:16]}")


if __name__ == "__main__":
    main()
