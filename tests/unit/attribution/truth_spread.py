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

from attrib_agent.attribution.shapley import all_subsets, shapley_values
from attrib_agent.lab.score import SLOWED_RATIO
from attrib_agent.lab.truth import condition_label


def load(truth_dir: Path) -> dict[str, Any]:
    return dict(json.loads((truth_dir / "truth.json").read_text()))


def _weights(whales: list[str]) -> dict[str, dict[str, float]]:
    """weights[label][whale]: the coefficient of that condition's mean in the whale's Shapley value."""
    return {condition_label(s): shapley_values(whales, lambda x, _s=s: float(x == _s)) for s in all_subsets(whales)}


def short_shapley_se(truth: dict[str, Any], spec: str) -> dict[str, float]:
    whales = sorted(truth["whales"])
    cond = truth["shorts"][spec]["conditions"]
    var = dict.fromkeys(whales, 0.0)
    for label, per_whale in _weights(whales).items():
        t = cond[label]["ttft_s"]
        for w in whales:
            var[w] += per_whale[w] ** 2 * t["std"] ** 2 / t["n"]
    return {w: math.sqrt(v) for w, v in var.items()}


def whale_totals(truth: dict[str, Any]) -> dict[str, tuple[float, float]]:
    """whale -> (summed Shapley TTFT share over shorts, its standard error), as lab/score.py sums it."""
    whales = sorted(truth["whales"])
    total, var = dict.fromkeys(whales, 0.0), dict.fromkeys(whales, 0.0)
    for spec, entry in truth["shorts"].items():
        shap = entry["shapley"].get("ttft_s")
        if not shap:
            continue
        se = short_shapley_se(truth, spec)
        for w in whales:
            total[w] += max(0.0, shap[w])
            var[w] += se[w] ** 2
    return {w: (total[w], math.sqrt(var[w])) for w in whales}


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
