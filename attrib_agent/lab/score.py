"""Score the attribution engine (and the naive overlap baseline) against the lab's counterfactual truth.

For every kept recording of a truth directory, the recording is replayed through the engine; the
blame each short puts on each whale (averaged over the reps of the all-whales condition) is compared
with the whale's Shapley share of that short's measured slowdown. Null runs (the no-whale condition)
check that the engine reports no interference where there was none.
"""

from __future__ import annotations

import functools
import json
import statistics
from collections import defaultdict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attrib_agent.lab.server import LabError
from attrib_agent.recording import CLIENT, Recording

# blame[victim spec id][culprit spec id] = seconds of TTFT blamed; one dict per recording.
Blamer = Callable[[Path], dict[str, dict[str, float]]]

SLOWED_RATIO = 2.0  # a short counts as "slowed" when its TTFT with all whales is >= 2x its TTFT alone
NULL_BLAME_S = 0.050  # in a null run, blaming more than this on anyone is a false alarm


@dataclass
class Score:
    name: str
    top1_hits: int = 0
    top1_total: int = 0
    whale_rel_errors: dict[str, float] = field(default_factory=dict)
    null_flagged: int = 0
    null_total: int = 0
    itl_whale_rel_errors: dict[str, float] = field(default_factory=dict)  # the same per whale, for mean ITL

    @property
    def top1(self) -> float | None:
        return self.top1_hits / self.top1_total if self.top1_total else None

    @property
    def median_whale_error(self) -> float | None:
        errs = list(self.whale_rel_errors.values())
        return statistics.median(errs) if errs else None

    @property
    def median_itl_whale_error(self) -> float | None:
        errs = list(self.itl_whale_rel_errors.values())
        return statistics.median(errs) if errs else None

    @property
    def null_false_alarm(self) -> float | None:
        return self.null_flagged / self.null_total if self.null_total else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "top1_agreement": self.top1, "top1_cases": self.top1_total,
                "median_whale_rel_error": self.median_whale_error, "whale_rel_errors": self.whale_rel_errors,
                "null_false_alarm_share": self.null_false_alarm, "null_requests": self.null_total,
                "median_itl_whale_rel_error": self.median_itl_whale_error,
                "itl_whale_rel_errors": self.itl_whale_rel_errors}


def spec_ids(rec: Recording) -> dict[str, str]:
    """vLLM request id -> stable spec id, from the lab client's records."""
    return {c["vllm_request_id"]: c["spec_id"] for c in rec.records(CLIENT) if c.get("vllm_request_id")}


def score_truth(truth_dir: Path, name: str, blamer: Blamer, itl_blamer: Blamer | None = None) -> Score:
    truth_path = truth_dir / "truth.json"
    if not truth_path.is_file():
        raise LabError(f"{truth_dir}: no truth.json")
    truth = json.loads(truth_path.read_text())
    runs = [r for r in truth["runs"] if r.get("accepted") and r.get("recording")]
    if not runs:
        raise LabError(f"{truth_dir}: truth has no kept recordings; make it with `lab truth --keep-recordings`")
    all_label = truth["conditions"][-1]
    score = Score(name)
    blame_sum: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    itl_sum: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
    reps = 0
    for run in runs:
        blame = blamer(truth_dir / run["recording"])
        if run["condition"] == "none":
            for spec in truth["shorts"]:
                score.null_total += 1
                score.null_flagged += max(blame.get(spec, {}).values(), default=0.0) > NULL_BLAME_S
        elif run["condition"] == all_label:
            reps += 1
            for spec, per in blame.items():
                for culprit, s in per.items():
                    blame_sum[spec][culprit] += s
            for spec, per in (itl_blamer(truth_dir / run["recording"]) if itl_blamer else {}).items():
                for culprit, s in per.items():
                    itl_sum[spec][culprit] += s
    whales = sorted(truth["whales"])
    true_total: dict[str, float] = defaultdict(float)
    blamed_total: dict[str, float] = defaultdict(float)
    for spec, entry in truth["shorts"].items():
        shap: Mapping[str, float] = entry["shapley"].get("ttft_s", {})
        cond = entry["conditions"]
        if not shap or "ttft_s" not in cond.get("none", {}) or "ttft_s" not in cond.get(all_label, {}):
            continue
        blamed = {w: blame_sum[spec].get(w, 0.0) / max(reps, 1) for w in whales}
        for w in whales:
            true_total[w] += max(0.0, shap.get(w, 0.0))
            blamed_total[w] += blamed[w]
        alone, crowded = cond["none"]["ttft_s"]["mean"], cond[all_label]["ttft_s"]["mean"]
        if crowded >= SLOWED_RATIO * alone:
            score.top1_total += 1
            true_top = max(whales, key=lambda w: shap.get(w, 0.0))
            got_top = max(whales, key=lambda w: blamed[w])
            score.top1_hits += int(blamed[got_top] > 0 and got_top == true_top)
    for w in whales:
        if true_total[w] > 0:
            score.whale_rel_errors[w] = abs(blamed_total[w] - true_total[w]) / true_total[w]
    if itl_blamer is not None:
        score.itl_whale_rel_errors = _itl_errors(truth, whales, itl_sum, max(reps, 1))
    return score


def _itl_errors(truth: Mapping[str, Any], whales: list[str], blamed: Mapping[str, Mapping[str, float]],
                reps: int) -> dict[str, float]:
    """Per whale, |blamed - true| / true of its summed Shapley share of the shorts' mean ITL: where a mid-stream
    stall (a preemption) or decoding beside a prefill shows."""
    true_total: dict[str, float] = defaultdict(float)
    blamed_total: dict[str, float] = defaultdict(float)
    for spec, entry in truth["shorts"].items():
        shap: Mapping[str, float] = entry["shapley"].get("mean_itl_s", {})
        for w in whales if shap else ():
            true_total[w] += max(0.0, shap.get(w, 0.0))
            blamed_total[w] += blamed.get(spec, {}).get(w, 0.0) / reps
    return {w: abs(blamed_total[w] - true_total[w]) / true_total[w] for w in whales if true_total[w] > 0}


def format_scores(scores: list[Score]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f} %"

    head = (f"{'':<24} {'top-1 agreement':>16} {'median |err| per whale':>24} {'null false alarms':>18}"
            f" {'ITL |err| per whale':>20}")
    lines = [head]
    for s in scores:
        lines.append(f"{s.name:<24} {pct(s.top1):>10} ({s.top1_hits}/{s.top1_total})"
                     f" {pct(s.median_whale_error):>24} {pct(s.null_false_alarm):>12}"
                     f" ({s.null_flagged}/{s.null_total}) {pct(s.median_itl_whale_error):>13}")
    lines.append("goals: top-1 >= 95 % on shorts slowed >= 2x; median error <= 20 %; null false alarms <= 5 %"
                 " (errors of summed TTFT shares; ITL: of the shorts' mean ITL)")
    return "\n".join(lines)


@functools.lru_cache(maxsize=64)
def replayed_timeline(path: Path) -> Any:
    """The timeline of one recording's replay, once: attribution and the step-truth score both read it."""
    from attrib_agent.sources.replay import ReplaySource
    from attrib_agent.timeline.engine_timeline import EngineTimeline

    tl = EngineTimeline()
    tl.feed_all(ReplaySource(path).events())
    return tl


@functools.lru_cache(maxsize=64)
def attributed(path: Path) -> tuple[list[Any], dict[str, Any], dict[str, str]]:
    """Replay + attribution of one recording, once: the engine and the naive baseline both read it."""
    from attrib_agent.attribution.attributor import Attributor

    tl = replayed_timeline(path)
    results = Attributor().attribute(tl)
    return results, {lc.request_id: lc for lc in tl.lifecycles()}, spec_ids(Recording(path))


def engine_blame(path: Path) -> dict[str, dict[str, float]]:
    """The engine's TTFT blame per victim and culprit, keyed by the lab's spec ids."""
    results, _, spec = attributed(path)
    return {spec[r.request_id]: {spec.get(c.request_id, c.request_id): c.ttft_s for c in r.culprits}
            for r in results if r.request_id in spec}


def engine_itl_blame(path: Path) -> dict[str, dict[str, float]]:
    """The engine's blame of each victim's mean ITL (seconds per token) per culprit, keyed by spec ids."""
    results, _, spec = attributed(path)
    return {spec[r.request_id]: {spec.get(c.request_id, c.request_id): c.itl_s for c in r.culprits}
            for r in results if r.request_id in spec}


def naive_blame(path: Path) -> dict[str, dict[str, float]]:
    """Overlap-proportional blame of the same measured slowdown (the correlation baseline)."""
    from attrib_agent.lab.naive import overlap_blame

    results, lcs, spec = attributed(path)
    out: dict[str, dict[str, float]] = {}
    for r in results:
        if r.request_id not in spec:
            continue
        blame = overlap_blame(lcs[r.request_id], lcs.values(), r.ttft_slowdown_s)
        out[spec[r.request_id]] = {spec.get(k, k): v for k, v in blame.items()}
    return out


def score_command(truth_dir: Path) -> list[Score]:
    return [score_truth(truth_dir, "attrib-agent", engine_blame, engine_itl_blame),
            score_truth(truth_dir, "naive overlap", naive_blame)]
