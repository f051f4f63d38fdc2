"""CPU of the causes' period fit (attribution/period_cost.py): what it adds per step to the elapsed fit alone.

    .venv/bin/python -m benchmarks.period_fit [--events 20000] [--reps 3]

The GPU-rate input's first `--events` events (benchmarks/_gpu_rate.py, built once and cached) go through the
timeline; its steps are then fed, in order, to the elapsed fit alone and to the elapsed and period fits together,
as `Attributor.learn` feeds them (every refit where it falls: replay, unshed), alternating, `--reps` times each.
Printed: CPU seconds of each, the period fit's CPU per step fed and per refit, and one refit of a full window
from a warm start (what a pass adds while the live agent sheds load: one refit a pass).
"""

from __future__ import annotations

import argparse
import statistics
import time
from itertools import islice

from attrib_agent.attribution.cost_model import StepCostModel, record_row, row_ok
from attrib_agent.attribution.period_cost import PeriodCost
from attrib_agent.pipeline import PipelineConfig
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import EngineTimeline
from attrib_agent.timeline.model import StepRecord
from benchmarks._gpu_rate import cached_gpu_rate


def _steps(events: int) -> list[StepRecord]:
    cfg = PipelineConfig()
    tl = EngineTimeline(cfg.block_size, cfg.num_blocks, engine=cfg.engine, token_budget=cfg.token_budget)
    for ev in islice(ReplaySource(cached_gpu_rate().path).events(), events):
        tl.feed(ev)
    return [out.record for _, out in tl.outcomes()]


def _fed(steps: list[StepRecord], period: bool) -> tuple[float, PeriodCost]:
    """As `Attributor.learn` feeds them: each step shaped and checked once, for both fits."""
    elapsed = StepCostModel()
    fit = PeriodCost(elapsed)
    t = time.process_time()
    for record in steps:
        row = record_row(record)
        ok = row_ok(row)
        elapsed.observe_row(row, record.elapsed_s, checked=ok)
        if period:
            fit.observe_row(record, row, ok)
    return time.process_time() - t, fit


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--events", type=int, default=20000)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args(argv)
    steps = _steps(args.events)
    alone, both = [], []
    fit = None
    for _ in range(args.reps):
        alone.append(_fed(steps, False)[0])
        dt, fit = _fed(steps, True)
        both.append(dt)
    assert fit is not None
    model = fit.model
    refits = len(range(model.min_steps, model.steps_seen + 1, model.refit_every))
    extra = [b - a for a, b in zip(alone, both, strict=True)]
    print(f"{len(steps):,} steps ({model.steps_seen:,} back to back: periods fitted), {refits} period refits")
    print(f"elapsed fit alone: {', '.join(f'{x:.2f}' for x in alone)} CPU s; with the period fit: "
          f"{', '.join(f'{x:.2f}' for x in both)} CPU s")
    print(f"period fit: {statistics.median(extra) / len(steps) * 1e6:.1f} us CPU a step fed (median; "
          f"{min(extra) / len(steps) * 1e6:.1f}-{max(extra) / len(steps) * 1e6:.1f}), "
          f"{statistics.median(extra) / max(refits, 1) * 1e3:.2f} ms a refit")
    warm = []
    for _ in range(20):
        t = time.process_time()
        model.refit()
        warm.append(time.process_time() - t)
    print(f"one refit of the full window ({model.window_steps} steps), warm: median "
          f"{statistics.median(warm) * 1e3:.2f} ms CPU [{min(warm) * 1e3:.2f}, {max(warm) * 1e3:.2f}] (20)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
