"""How precisely a committed truth knows each whale's share: the standard error of its Shapley totals, from the
spread of each condition's reps (truth.json keeps mean, std and n per short and condition).

A Shapley value is linear in the condition means, so its variance is the sum of each condition's variance of
the mean (std**2 / n, reps independent) times the square of that condition's Shapley weight. A score bound
tighter than about two of these standard errors would be holding the engine to the truth's noise.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from attrib_agent.lab.score import SLOWED_RATIO, short_shapley_se, whale_truths

__all__ = ["ambiguous_top1", "load", "short_shapley_se", "whale_totals"]


def load(truth_dir: Path) -> dict[str, Any]:
    return dict(json.loads((truth_dir / "truth.json").read_text()))


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
