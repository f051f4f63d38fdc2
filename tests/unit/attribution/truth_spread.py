"""How precisely a committed truth knows each whale's share: the standard error of its Shapley totals, from the
runs themselves (each run's figures of every short, read from its kept recording: `score.with_run_values`).

A Shapley value is linear in the condition means, so its variance is the sum of each condition's variance of
the mean times the square of that condition's Shapley weight; for a total over shorts, the variance of the
mean of the runs' sums (shorts of one run move together: `score.effect_se`). A score bound tighter than about
two of these standard errors would be holding the engine to the truth's noise.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from attrib_agent.lab.score import SLOWED_RATIO, short_shapley_se, whale_truths, with_run_values
from attrib_agent.lab.truth import build_truth
from attrib_agent.lab.workload import SISO, RequestSpec, Scenario, whale

__all__ = ["ambiguous_top1", "load", "short_shapley_se", "truth_of_runs", "whale_totals"]

RunFigures = dict[str, dict[str, float]]  # one run: short spec id -> metric -> value


def truth_of_runs(whales: dict[str, float], shorts: dict[str, float], runs: dict[str, list[RunFigures]]
                  ) -> dict[str, Any]:
    """A truth as `lab truth` builds it (`build_truth`) from hand-made runs: `whales` and `shorts` give each spec
    id's send offset, runs[condition label] one figures dict per rep; each run keeps its figures ("values")."""
    scenario = Scenario("tiny", "hand-made runs", tuple(
        [RequestSpec(w, whale(1000, 10), at) for w, at in whales.items()]
        + [RequestSpec(s, SISO, at) for s, at in shorts.items()]))
    obs: dict[str, dict[str, dict[str, list[float]]]] = {}
    kept = []
    for label, reps in runs.items():
        for rep, figures in enumerate(reps):
            kept.append({"condition": label, "rep": rep, "accepted": True, "recording": f"runs/{label}-r{rep}",
                         "values": figures})
            for spec, per in figures.items():
                for metric, v in per.items():
                    obs.setdefault(spec, {}).setdefault(label, {}).setdefault(metric, []).append(v)
    return build_truth(scenario, max(len(r) for r in runs.values()), obs, kept)


def load(truth_dir: Path) -> dict[str, Any]:
    """The truth with each run's per-short figures, as the scorers read it."""
    return with_run_values(json.loads((truth_dir / "truth.json").read_text()), truth_dir)


def whale_totals(truth: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """whale -> (summed Shapley TTFT share over shorts, each clipped at 0, and its standard error), as lab/score.py
    sums them (`whale_truths`, which also gives the net sum, the blame and whether the share is resolved)."""
    return {w: (t.true_s, t.se_s) for w, t in whale_truths(truth, "ttft_s", {}, 1, truth["shorts"]).items()}


def ambiguous_top1(truth: dict[str, Any]) -> int:
    """Shorts slowed >= 2x whose true top culprit is within two standard errors of the runner-up."""
    whales, last = sorted(truth["whales"]), truth["conditions"][-1]
    n = 0
    for spec, entry in truth["shorts"].items():
        shap, cond = entry["shapley"].get("ttft_s"), entry["conditions"]
        if not shap or cond[last]["ttft_s"]["mean"] < SLOWED_RATIO * cond["none"]["ttft_s"]["mean"]:
            continue
        se = short_shapley_se(truth, spec)
        first, second = sorted(whales, key=lambda w: -shap[w])[:2]
        n += shap[first] - shap[second] < 2 * math.hypot(se[first], se[second])
    return n
