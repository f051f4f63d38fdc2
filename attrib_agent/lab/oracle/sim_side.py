"""The project's re-simulation (`attribution.scheduler_sim`) run over a workload, seen step by step."""

from __future__ import annotations

from attrib_agent.attribution.scheduler_sim import simulate
from attrib_agent.attribution.sim_step import LiveRequest, StepPlan
from attrib_agent.attribution.sim_types import StepCost
from attrib_agent.lab.oracle.steps import RunTrace, StepView
from attrib_agent.lab.oracle.workload import Workload


def run_sim(workload: Workload, cost: StepCost, *, max_steps: int = 20_000) -> RunTrace:
    trace = RunTrace()
    step_ending: dict[float, int] = {}  # end time -> step index (steps never overlap)

    def on_step(plan: StepPlan, running: list[LiveRequest], start: float, end: float) -> None:
        trace.steps.append(StepView(
            scheduled=tuple(sorted((m.request_id, m.tokens) for m in plan.members)),
            admitted=tuple(sorted(r.req.request_id for r in plan.admitted)),
            preempted=tuple(sorted(r.req.request_id for r in plan.preempted)),
            blocks=tuple(sorted((r.req.request_id, r.blocks) for r in running)),
            start_ts=start))
        step_ending[end] = len(trace.steps) - 1

    result = simulate(workload.sim_requests(), workload.config, cost, max_steps=max_steps, on_step=on_step)
    for rid, outcome in result.outcomes.items():
        if outcome.first_token_ts is None:
            trace.truncated = True
            continue
        trace.first_token_ts[rid] = outcome.first_token_ts
        trace.first_token_step[rid] = step_ending[outcome.first_token_ts]
    return trace
