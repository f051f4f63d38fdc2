"""Counterfactual ground truth: the same short-request schedule under every subset of whales.

For each short request (stable spec id) and each condition (subset of whales present), the client TTFT
and mean ITL over N reps; v(S) = mean under S minus mean with no whale, and each whale's Shapley
share of v(all whales). The attribution engine is scored against this file.
"""

from __future__ import annotations

import json
import shutil
import statistics
import tempfile
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Final

from attrib_agent.attribution.shapley import all_subsets, shapley_values
from attrib_agent.lab.record import RunRejected, record_run
from attrib_agent.lab.server import LabEndpoints, LabError
from attrib_agent.lab.summary import Spread, group_latency, mean_itl_s, shorts, ttft_s
from attrib_agent.lab.workload import Scenario

TRUTH_FORMAT: Final = "attrib-truth"
TRUTH_VERSION: Final = 1
METRICS: Final[dict[str, Callable[[Mapping[str, Any]], float | None]]] = {"ttft_s": ttft_s, "mean_itl_s": mean_itl_s}


def run_figures(results: Iterable[Mapping[str, Any]]) -> dict[str, dict[str, float]]:
    """Each short's figures in one run (spec id -> metric -> value; numbers only, no prompt text): a summed effect's
    standard error needs the runs' sums, whose shorts move together (lab/score.py `effect_se`)."""
    return {r["spec_id"]: {m: v for m, fn in METRICS.items() if (v := fn(r)) is not None} for r in shorts(results)}


def condition_label(subset: frozenset[str]) -> str:
    return "+".join(sorted(subset)) or "none"


def build_truth(
    scenario: Scenario,
    reps: int,
    observations: dict[str, dict[str, dict[str, list[float]]]],
    runs: list[dict[str, Any]],
) -> dict[str, Any]:
    """Pure: observations[spec_id][condition][metric] = values over accepted reps -> truth.json."""
    whales = sorted(w.spec_id for w in scenario.whales)
    subsets = all_subsets(whales)
    labels = [condition_label(s) for s in subsets]
    out_shorts: dict[str, Any] = {}
    for spec in scenario.shorts:
        per_cond = observations.get(spec.spec_id, {})
        entry: dict[str, Any] = {"class": spec.klass.name, "offset_s": spec.offset_s, "conditions": {},
                                 "slowdown": {}, "shapley": {}}
        for label in labels:
            entry["conditions"][label] = {
                m: Spread.of(vals).as_dict() for m, vals in per_cond.get(label, {}).items() if vals
            }
        for metric in METRICS:
            means = {label: entry["conditions"][label].get(metric, {}).get("mean") for label in labels}
            if any(v is None for v in means.values()):
                continue  # a condition never produced this figure for this short: no fair split
            base = float(means["none"] or 0.0)

            def value(s: frozenset[str], _means: dict[str, Any] = means, _base: float = base) -> float:
                return float(_means[condition_label(s)]) - _base

            entry["slowdown"][metric] = {label: value(s) for label, s in zip(labels, subsets, strict=True)}
            entry["shapley"][metric] = shapley_values(whales, value)
        out_shorts[spec.spec_id] = entry
    return {
        "format": TRUTH_FORMAT,
        "version": TRUTH_VERSION,
        "scenario": scenario.name,
        "whales": {w.spec_id: {"prompt_tokens": w.klass.prompt_tokens, "output_tokens": w.klass.output_tokens,
                               "offset_s": w.offset_s} for w in scenario.whales},
        "conditions": labels,
        "reps": reps,
        "shorts": out_shorts,
        "runs": runs,
    }


def run_truth(
    lab: LabEndpoints,
    scenario: Scenario,
    reps: int,
    out: Path,
    *,
    keep_recordings: bool = False,
    max_lateness_s: float = 0.020,
    attempts: int = 3,
    command: str = "",
    progress: Callable[[str], None] = lambda _msg: None,
) -> dict[str, Any]:
    """Run every condition `reps` times, interleaved (rep-major) so slow drift hits all conditions alike."""
    if not scenario.whales:
        raise LabError(f"scenario {scenario.name!r} has no whales: nothing to attribute")
    if reps < 1:
        raise LabError("reps must be at least 1")
    out.mkdir(parents=True, exist_ok=True)
    whales = sorted(w.spec_id for w in scenario.whales)
    observations: dict[str, dict[str, dict[str, list[float]]]] = {}
    runs: list[dict[str, Any]] = []
    scratch = tempfile.TemporaryDirectory(prefix="attrib-truth-")
    try:
        for rep in range(reps):
            for subset in all_subsets(whales):
                label = condition_label(subset)
                variant = scenario.with_whales(subset)
                root = out / "runs" if keep_recordings else Path(scratch.name)
                rec_dir = root / f"{label}-r{rep}"
                progress(f"rep {rep + 1}/{reps} condition {label}")
                try:
                    res = record_run(lab, variant, rec_dir, max_lateness_s=max_lateness_s, attempts=attempts,
                                     command=command, extra_meta={"truth_condition": label, "truth_rep": rep})
                except RunRejected as e:
                    shutil.rmtree(rec_dir, ignore_errors=True)  # a late run's numbers are not kept
                    runs.append({"condition": label, "rep": rep, "accepted": False, "reason": str(e)})
                    continue
                g = group_latency(shorts(res.results))
                values = run_figures(res.results)
                runs.append({
                    "condition": label, "rep": rep, "accepted": True, "run_tag": res.meta["run_tag"],
                    "lateness_s": res.meta["client_lateness"]["lateness_s"], "preemptions": res.meta["preemptions"],
                    "shorts_ttft_p50_s": g.ttft_p50_s, "shorts_itl_mean_s": g.itl_mean_s,
                    "recording": str(rec_dir.relative_to(out)) if keep_recordings else None, "values": values,
                })
                for r in shorts(res.results):
                    for metric, fn in METRICS.items():
                        v = fn(r)
                        if v is not None:
                            cond = observations.setdefault(r["spec_id"], {}).setdefault(label, {})
                            cond.setdefault(metric, []).append(v)
    finally:
        scratch.cleanup()
    missing = {r["condition"] for r in runs} - {r["condition"] for r in runs if r["accepted"]}
    if missing:
        raise LabError(f"no accepted run for condition(s) {sorted(missing)}; the machine is too busy")
    truth = build_truth(scenario, reps, observations, runs)
    truth["command"] = command
    (out / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True) + "\n")
    return truth


def truth_table(truth: dict[str, Any]) -> str:
    """Per condition: median over shorts of mean TTFT, and the summed Shapley shares per whale."""
    lines = [f"scenario {truth['scenario']}, {truth['reps']} rep(s) per condition"]
    for label in truth["conditions"]:
        vals = [s["conditions"][label]["ttft_s"]["mean"] for s in truth["shorts"].values()
                if "ttft_s" in s["conditions"].get(label, {})]
        if vals:
            lines.append(f"  {label:<14} shorts' TTFT median {statistics.median(vals) * 1000:9.1f} ms")
    totals: dict[str, float] = {}
    for s in truth["shorts"].values():
        for w, phi in s["shapley"].get("ttft_s", {}).items():
            totals[w] = totals.get(w, 0.0) + phi
    for w, t in sorted(totals.items()):
        lines.append(f"  Shapley TTFT share of {w}: {t:8.3f} s summed over shorts")
    return "\n".join(lines)
