"""Score the timeline against vLLM's own per-step facts (the step plugin's `vllm_steps` stream, lab only).

The plugin reports what the scheduler decided at every step (docs/exact-mode.md); the timeline infers
the same from logs, gauges and spans. Compared per step, by `Iteration(N)` index: which requests were in
the step, how many KV blocks each held, and which requests were preempted. The agent reads it only in exact mode
(`replay --exact`); scoring replays without it, so the inference is what is scored.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from attrib_agent.lab.cause_truth import CauseAgreement
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.timeline.preemption import InferredPreemption
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome
from attrib_agent.vllm_ids import external_id

PREEMPTION_TOLERANCE_STEPS = 3  # an inferred preemption this many steps from vLLM's own still names it


@dataclass(frozen=True, slots=True)
class TruthStep:
    """One plugin step message, ids mapped to the frontend's (the timeline's) ids."""

    iteration: int
    members: frozenset[str]
    blocks: Mapping[str, int]
    preempted: tuple[str, ...]


@dataclass
class StepTruthScore:
    steps: int = 0  # truth steps that scheduled tokens
    steps_in_timeline: int = 0  # of those, steps the timeline holds (same Iteration index)
    membership_exact: int = 0  # ... whose member set equals vLLM's
    block_pairs: int = 0  # (step, request) pairs compared, over requests either side holds blocks for
    block_abs_error: int = 0  # summed |timeline blocks - vLLM blocks| over those pairs
    block_exact: int = 0
    preempted_true: int = 0
    preempted_named: int = 0  # preemptions the timeline inferred
    preempted_hits: int = 0  # inferred ones matching a true one (same request, within tolerance)

    @property
    def membership_share(self) -> float | None:
        return self.membership_exact / self.steps_in_timeline if self.steps_in_timeline else None

    @property
    def block_exact_share(self) -> float | None:
        return self.block_exact / self.block_pairs if self.block_pairs else None

    @property
    def block_mean_abs_error(self) -> float | None:
        return self.block_abs_error / self.block_pairs if self.block_pairs else None

    @property
    def preemption_precision(self) -> float | None:
        return self.preempted_hits / self.preempted_named if self.preempted_named else None

    @property
    def preemption_recall(self) -> float | None:
        return self.preempted_hits / self.preempted_true if self.preempted_true else None

    def add(self, other: StepTruthScore) -> None:
        for k, v in asdict(other).items():
            setattr(self, k, getattr(self, k) + v)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "membership_share": self.membership_share, "block_exact_share": self.block_exact_share,
                "block_mean_abs_error": self.block_mean_abs_error,
                "preemption_precision": self.preemption_precision, "preemption_recall": self.preemption_recall}


def truth_steps(messages: Iterable[Mapping[str, Any]]) -> list[TruthStep]:
    """Step messages of format v1 that scheduled tokens; others (hello, empty steps, newer versions) are skipped."""
    out = []
    for m in messages:
        if m.get("v") != 1 or m.get("kind") != "step" or not isinstance(m.get("iter"), int):
            continue
        out.append(TruthStep(
            m["iter"], frozenset(external_id(s["id"]) for s in m.get("scheduled", ())),
            {external_id(k): int(v) for k, v in (m.get("blocks") or {}).items()},
            tuple(external_id(r) for r in m.get("preempted", ()))))
    return out


def score_steps(truth: Sequence[TruthStep], outcomes: Sequence[tuple[StepInput, StepOutcome]],
                inferred: Sequence[InferredPreemption]) -> StepTruthScore:
    """Compare the timeline's steps and inferred preemptions with vLLM's, step by step."""
    score = StepTruthScore()
    by_iter = {si.iteration: out for si, out in outcomes}
    true_preemptions: list[tuple[str, int]] = []
    for t in truth:
        score.steps += 1
        # Listed on the step whose scheduling preempted it: the first step the victim is absent from.
        true_preemptions.extend((rid, t.iteration) for rid in t.preempted)
        out = by_iter.get(t.iteration)
        if out is None:
            continue
        score.steps_in_timeline += 1
        members = frozenset(m.request_id for m in out.record.members)
        score.membership_exact += members == t.members
        held = dict(out.holdings)
        for rid in set(held) | set(t.blocks):
            err = abs(held.get(rid, 0) - t.blocks.get(rid, 0))
            score.block_pairs += 1
            score.block_abs_error += err
            score.block_exact += err == 0
    score.preempted_true = len(true_preemptions)
    score.preempted_named = len(inferred)
    unmatched = list(true_preemptions)
    for p in inferred:
        hit = next((x for x in unmatched if x[0] == p.request_id
                    and abs(x[1] - p.preempted_iteration) <= PREEMPTION_TOLERANCE_STEPS), None)
        if hit is not None:
            unmatched.remove(hit)
            score.preempted_hits += 1
    return score


def score_recording(path: Path) -> StepTruthScore | None:
    """The replayed timeline of one recording against its plugin stream (None without the stream)."""
    from attrib_agent.lab.score import replayed_timeline

    rec = Recording(path)
    if not rec.has(VLLM_STEPS):
        return None
    truth = truth_steps(rec.records(VLLM_STEPS))
    tl = replayed_timeline(path)
    return score_steps(truth, tl.outcomes(), tl.preemptions())


def recordings_of(path: Path) -> list[Path]:
    """A recording, or every kept recording of a truth directory."""
    if (path / "truth.json").is_file():
        runs = json.loads((path / "truth.json").read_text()).get("runs", [])
        return [path / r["recording"] for r in runs if r.get("accepted") and r.get("recording")]
    return [path]


def score_dir(path: Path) -> StepTruthScore | None:
    """A recording, or every kept recording of a truth directory, summed (None when none has the stream)."""
    total: StepTruthScore | None = None
    for rec in recordings_of(path):
        s = score_recording(rec)
        if s is not None:
            total = total or StepTruthScore()
            total.add(s)
    return total


def format_step_scores(rows: Sequence[tuple[str, StepTruthScore]],
                       causes: Mapping[str, CauseAgreement] | None = None) -> str:
    """The timeline's steps against vLLM's; with `causes`, the attribution's causes and preemption naming too."""

    lines = [f"{'per-step truth (vLLM plugin)':<30} {'steps seen':>11} {'membership':>11} {'blocks exact':>13}"
             f" {'|blocks err|':>13} {'preempt P':>10} {'preempt R':>10}"]
    for name, s in rows:
        err = "-" if s.block_mean_abs_error is None else f"{s.block_mean_abs_error:.2f}"
        lines.append(f"{name:<30} {s.steps_in_timeline:>5}/{s.steps:<5} {pct(s.membership_share):>11}"
                     f" {pct(s.block_exact_share):>13} {err:>13}"
                     f" {pct(s.preemption_precision):>10} {pct(s.preemption_recall):>10}"
                     f"  ({s.preempted_hits} of {s.preempted_named} named, {s.preempted_true} true)")
    if causes:
        lines.append(f"{'causes vs vLLM (attribution)':<30} {'agree':>11} {'main cause':>11} {'of blamed s':>13}"
                     f" {'unseen s':>10}"
                     f" {'named P':>13} {'named R':>10}")
        for name, c in causes.items():
            lines.append(f"{name:<30} {pct(c.share):>11} {pct(c.dominant_share):>11} {c.blamed_s:>13.1f}"
                         f" {c.unseen_s:>10.1f}"
                         f" {pct(c.precision):>13} {pct(c.recall):>10}"
                         f"  ({c.preempted_hits} of {c.preempted_named} named `preemption`, {c.preempted_true} true)")
        lines.append(f"{'cause named vs vLLM':<30} {'cause':>11} {'victims P':>11} {'victims R':>13}"
                     f" {'pairs P':>10} {'pairs R':>13}")
        for name, c in causes.items():
            for cause, v in c.victims.items():
                p = c.pairs[cause]
                lines.append(f"{name:<30} {cause:>11} {pct(v.as_dict()['precision']):>11}"
                             f" {pct(v.as_dict()['recall']):>13} {pct(p.as_dict()['precision']):>10}"
                             f" {pct(p.as_dict()['recall']):>13}  (victims {v.hits} of {v.named} named, {v.true} true;"
                             f" (victim, culprit, phase) {p.hits} of {p.named} named, {p.true} true)")
        lines.append("goals: causes agree on >= 90 % of blamed seconds; preempted victims named with precision and"
                     " recall >= 90 %")
    return "\n".join(lines)


def pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:.0f} %"
