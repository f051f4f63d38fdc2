"""Run one workload through vLLM's scheduler and the re-simulation and diff them step by step.

Steps are compared by index: identical when the same requests are scheduled with the same token counts, the
same are admitted and preempted, and every running request holds the same number of KV blocks. Once the two
runs part, later steps usually differ too, so the share of identical steps is a strict measure.
"""

from __future__ import annotations

import statistics
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from attrib_agent.attribution.cost_model import StepCostModel, StepCostPrior
from attrib_agent.attribution.sim_types import StepCost
from attrib_agent.lab.oracle.sim_side import run_sim
from attrib_agent.lab.oracle.steps import RunTrace
from attrib_agent.lab.oracle.vllm_scheduler import run_vllm
from attrib_agent.lab.oracle.workload import Workload


def default_cost() -> StepCost:
    """The lab CPU prior: both sides price steps with it, so agreeing steps agree in time too."""
    return StepCostModel(StepCostPrior())


@dataclass(frozen=True, slots=True)
class Comparison:
    name: str
    steps: int  # the longer run's step count
    identical: int
    first_divergence: int | None  # step index
    what_differs: tuple[str, ...]  # parts that differed at the first divergence
    ttft_step_diffs: tuple[int, ...]  # per request present in both: |first-token step difference|
    ttft_s_diffs: tuple[float, ...]
    oracle_preemptions: int
    sim_preemptions: int


def compare_traces(name: str, oracle: RunTrace, sim: RunTrace) -> Comparison:
    n = max(len(oracle.steps), len(sim.steps))
    same = [i for i in range(min(len(oracle.steps), len(sim.steps))) if oracle.steps[i] == sim.steps[i]]
    first = next((i for i in range(n) if i >= len(oracle.steps) or i >= len(sim.steps)
                  or oracle.steps[i] != sim.steps[i]), None)
    parts: tuple[str, ...] = ()
    if first is not None:
        parts = (("length",) if first >= min(len(oracle.steps), len(sim.steps))
                 else tuple(oracle.steps[first].differences(sim.steps[first])))
    both = sorted(set(oracle.first_token_step) & set(sim.first_token_step))
    return Comparison(
        name, n, len(same), first, parts,
        tuple(abs(oracle.first_token_step[r] - sim.first_token_step[r]) for r in both),
        tuple(abs(oracle.first_token_ts[r] - sim.first_token_ts[r]) for r in both),
        sum(len(s.preempted) for s in oracle.steps), sum(len(s.preempted) for s in sim.steps))


def compare(workload: Workload, cost: StepCost | None = None) -> Comparison:
    cost = cost or default_cost()
    return compare_traces(workload.name, run_vllm(workload, cost), run_sim(workload, cost))


@dataclass(slots=True)
class Agreement:
    """Totals over many workloads."""

    comparisons: list[Comparison] = field(default_factory=list)

    def add(self, c: Comparison) -> None:
        self.comparisons.append(c)

    @property
    def steps(self) -> int:
        return sum(c.steps for c in self.comparisons)

    @property
    def identical(self) -> int:
        return sum(c.identical for c in self.comparisons)

    @property
    def share(self) -> float:
        return self.identical / self.steps if self.steps else 1.0

    def ttft_steps(self) -> list[int]:
        return [d for c in self.comparisons for d in c.ttft_step_diffs]

    def ttft_seconds(self) -> list[float]:
        return [d for c in self.comparisons for d in c.ttft_s_diffs]

    def divergences(self) -> Counter[str]:
        return Counter(p for c in self.comparisons for p in c.what_differs)


def run_all(workloads: Iterable[Workload], cost: StepCost | None = None) -> Agreement:
    agreement = Agreement()
    for w in workloads:
        agreement.add(compare(w, cost))
    return agreement


def _quantiles(values: Sequence[float]) -> str:
    if not values:
        return "n/a"
    ordered = sorted(values)
    p90 = ordered[min(len(ordered) - 1, int(0.9 * len(ordered)))]
    return f"median {statistics.median(ordered):.3g}, p90 {p90:.3g}, max {ordered[-1]:.3g}"


def format_report(agreement: Agreement, *, per_workload: bool = True) -> str:
    lines = []
    if per_workload:
        for c in agreement.comparisons:
            where = "" if c.first_divergence is None else \
                f"  first differs at step {c.first_divergence} ({', '.join(c.what_differs)})"
            lines.append(f"{c.name:<58} {c.identical:>5}/{c.steps:<5} identical  preemptions vllm "
                         f"{c.oracle_preemptions} sim {c.sim_preemptions}{where}")
    kinds: dict[str, Agreement] = {}
    for c in agreement.comparisons:
        kinds.setdefault(c.name.split("#")[0], Agreement()).add(c)
    if len(kinds) > 1:
        for kind, part in kinds.items():
            lines.append(f"{kind}: {part.identical}/{part.steps} = {100 * part.share:.2f}% steps identical; "
                         f"TTFT difference (s): {_quantiles(part.ttft_seconds())}")
    ttft_req = agreement.ttft_steps()
    exact = sum(1 for d in ttft_req if d == 0)
    lines += [
        f"steps identical: {agreement.identical}/{agreement.steps} = {100 * agreement.share:.2f}% "
        f"over {len(agreement.comparisons)} workloads",
        f"requests with the same first-token step: {exact}/{len(ttft_req)}",
        f"per-request TTFT difference, steps: {_quantiles(ttft_req)}",
        f"per-request TTFT difference, seconds: {_quantiles(agreement.ttft_seconds())}",
        f"first divergences by part: {dict(agreement.divergences()) or 'none'}",
    ]
    return "\n".join(lines)
