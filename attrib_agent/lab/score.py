"""Score the attribution engine (and the naive overlap baseline) against the lab's counterfactual truth.

For every kept recording of a truth directory, the recording is replayed through the engine; the
blame each short puts on each whale (averaged over the reps of the all-whales condition) is compared
with the whale's Shapley share of that short's measured slowdown. Null runs (the no-whale condition)
check that the engine reports no interference where there was none.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from attrib_agent.lab.server import LabError
from attrib_agent.recording import CLIENT, Recording

# blame[victim spec id][culprit spec id] = seconds of TTFT blamed; one dict per recording.
Blamer = Callable[[Path], dict[str, dict[str, float]]]

SLOWED_RATIO = 2.0  # a short counts as "slowed" when its TTFT with all whales is >= 2x its TTFT alone
NULL_BLAME_S = 0.050  # in a null run, blaming more than this on anyone is a false alarm
RESOLVED_SE = 2.0  # a true share is resolved when it is at least this many of its standard errors from zero


def is_resolved(net_s: float, se_s: float) -> bool:
    """The one rule both scorers judge a truth by: it tells a whale's harm from none when the net (unclipped) effect
    is above 0 and at least RESOLVED_SE of its standard errors (`effect_se`). Clipping each short at 0 before summing
    is a bias: pure noise sums to a positive harm."""
    return net_s > 0 and net_s >= RESOLVED_SE * se_s


@dataclass(frozen=True)
class WhaleTruth:
    """One whale's summed true Shapley share, its standard error and the agent's summed blame (seconds).

    `true_s` sums each short's share clipped at 0 (the relative error has always used it); `net_s` sums them as
    they are: the linear combination of condition means whose standard error `se_s` is. Clipped, 40 shorts of pure
    run-to-run noise sum to about 16 of a short's standard errors against the sum's 6 (continuous-b1024/w1: 27 ms,
    2.3 SE, from a net 5 ms), so resolution and agreement are judged on the net share, a harm being >= 0."""

    true_s: float
    net_s: float
    se_s: float
    blamed_s: float

    @property
    def resolved(self) -> bool:
        """Whether the truth tells a harm from none (`is_resolved` on the net share)."""
        return is_resolved(self.net_s, self.se_s)

    @property
    def within_noise(self) -> bool:
        """Whether the blame is within RESOLVED_SE standard errors of the true harm (the net share, at least 0)."""
        return abs(self.blamed_s - max(self.net_s, 0.0)) <= RESOLVED_SE * self.se_s

    @property
    def rel_error(self) -> float:
        return abs(self.blamed_s - self.true_s) / self.true_s

    def as_dict(self) -> dict[str, Any]:
        return {"true_s": self.true_s, "net_s": self.net_s, "se_s": self.se_s, "blamed_s": self.blamed_s,
                "resolved": self.resolved, "within_noise": self.within_noise}


def _resolved(whales: Mapping[str, WhaleTruth]) -> list[str]:
    """The scored whales (true share > 0) whose true share the truth tells from none."""
    return sorted(w for w, t in whales.items() if t.true_s > 0 and t.resolved)


def _resolved_median(whales: Mapping[str, WhaleTruth]) -> float | None:
    errs = [whales[w].rel_error for w in _resolved(whales)]
    return statistics.median(errs) if errs else None


def _within_noise(whales: Mapping[str, WhaleTruth]) -> list[str]:
    """The scored whales (true share > 0) the truth does not resolve and whose blame is within its noise: their
    relative error measures the truth's run-to-run spread, not the agent."""
    return sorted(w for w, t in whales.items() if t.true_s > 0 and not t.resolved and t.within_noise)


@dataclass
class Score:
    name: str
    top1_hits: int = 0
    top1_total: int = 0
    whale_rel_errors: dict[str, float] = field(default_factory=dict)
    null_flagged: int = 0
    null_total: int = 0
    itl_whale_rel_errors: dict[str, float] = field(default_factory=dict)  # the same per whale, for mean ITL
    whales: dict[str, WhaleTruth] = field(default_factory=dict)  # per whale: true share, its SE, the blame
    itl_whales: dict[str, WhaleTruth] = field(default_factory=dict)  # the same for mean ITL

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
    def median_whale_error_resolved(self) -> float | None:
        """The median per-whale error over the whales whose true share is resolved (>= RESOLVED_SE of its SEs)."""
        return _resolved_median(self.whales)

    @property
    def median_itl_whale_error_resolved(self) -> float | None:
        return _resolved_median(self.itl_whales)

    @property
    def null_false_alarm(self) -> float | None:
        return self.null_flagged / self.null_total if self.null_total else None

    def as_dict(self) -> dict[str, Any]:
        return {"name": self.name, "top1_agreement": self.top1, "top1_cases": self.top1_total,
                "median_whale_rel_error": self.median_whale_error, "whale_rel_errors": self.whale_rel_errors,
                "null_false_alarm_share": self.null_false_alarm, "null_requests": self.null_total,
                "median_itl_whale_rel_error": self.median_itl_whale_error,
                "itl_whale_rel_errors": self.itl_whale_rel_errors,
                "median_whale_rel_error_resolved": self.median_whale_error_resolved,
                "resolved_whales": _resolved(self.whales),
                "agrees_within_noise": _within_noise(self.whales),
                "whales": {w: t.as_dict() for w, t in self.whales.items()},
                "median_itl_whale_rel_error_resolved": self.median_itl_whale_error_resolved,
                "itl_resolved_whales": _resolved(self.itl_whales),
                "itl_agrees_within_noise": _within_noise(self.itl_whales),
                "itl_whales": {w: t.as_dict() for w, t in self.itl_whales.items()}}


def spec_ids(rec: Recording) -> dict[str, str]:
    """vLLM request id -> stable spec id, from the lab client's records."""
    return {c["vllm_request_id"]: c["spec_id"] for c in rec.records(CLIENT) if c.get("vllm_request_id")}


def score_truth(truth_dir: Path, name: str, blamer: Blamer, itl_blamer: Blamer | None = None) -> Score:
    truth_path = truth_dir / "truth.json"
    if not truth_path.is_file():
        raise LabError(f"{truth_dir}: no truth.json")
    truth = with_run_values(json.loads(truth_path.read_text()), truth_dir)
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
    scored = []
    for spec, entry in truth["shorts"].items():
        shap: Mapping[str, float] = entry["shapley"].get("ttft_s", {})
        cond = entry["conditions"]
        if not shap or "ttft_s" not in cond.get("none", {}) or "ttft_s" not in cond.get(all_label, {}):
            continue
        scored.append(spec)
        blamed = {w: blame_sum[spec].get(w, 0.0) / max(reps, 1) for w in whales}
        alone, crowded = cond["none"]["ttft_s"]["mean"], cond[all_label]["ttft_s"]["mean"]
        if crowded >= SLOWED_RATIO * alone:
            score.top1_total += 1
            true_top = max(whales, key=lambda w: shap.get(w, 0.0))
            got_top = max(whales, key=lambda w: blamed[w])
            score.top1_hits += int(blamed[got_top] > 0 and got_top == true_top)
    score.whales = whale_truths(truth, "ttft_s", blame_sum, max(reps, 1), scored)
    score.whale_rel_errors = _rel_errors(score.whales)
    if itl_blamer is not None:
        score.itl_whales = whale_truths(truth, "mean_itl_s", itl_sum, max(reps, 1), truth["shorts"])
        score.itl_whale_rel_errors = _rel_errors(score.itl_whales)
    return score


def shapley_weights(whales: tuple[str, ...]) -> dict[str, dict[str, float]]:
    """weights[condition label][whale]: the coefficient of that condition's mean in the whale's Shapley value (the
    value is linear in the condition means)."""
    # Imported here, as the replay below: importing the score need not load the attribution or the recorder.
    from attrib_agent.attribution.shapley import all_subsets, shapley_values
    from attrib_agent.lab.truth import condition_label

    def only(subset: frozenset[str]) -> Callable[[frozenset[str]], float]:
        return lambda x: float(x == subset)  # 1 on this condition, 0 elsewhere: its Shapley values are the weights

    return {condition_label(s): shapley_values(whales, only(s)) for s in all_subsets(whales)}


@functools.lru_cache(maxsize=32)
def _recorded_values(truth_dir: Path) -> dict[str, dict[str, dict[str, float]]]:
    """By recording (as truth.json names it): each short's figures in that run (spec -> metric -> value), from the
    lab client's records, as `lab truth` measured them. Numbers only: no prompt text is kept. Once per truth dir."""
    from attrib_agent.lab.truth import run_figures

    truth = json.loads((truth_dir / "truth.json").read_text())
    return {run["recording"]: run_figures(Recording(truth_dir / run["recording"]).records(CLIENT))
            for run in truth["runs"]
            if run.get("accepted") and run.get("recording") and (truth_dir / run["recording"]).is_dir()}


def with_run_values(truth: Mapping[str, Any], truth_dir: Path) -> dict[str, Any]:
    """The truth with each accepted run's per-short figures ("values": spec -> metric -> value), read from its kept
    recording where truth.json does not give them: what `effect_se` needs to see how the shorts of a run move."""
    recorded = _recorded_values(truth_dir.resolve())
    runs = [r if "values" in r or r.get("recording") not in recorded else r | {"values": recorded[r["recording"]]}
            for r in truth["runs"]]
    return dict(truth) | {"runs": runs}


def effect_se(truth: Mapping[str, Any], weights: Mapping[str, float], specs: Iterable[str], metric: str) -> float:
    """The standard error of an effect summed over `specs`: sum over conditions of weights[label] x the summed
    condition means (a Shapley share, or with minus without). Each run's sum over the shorts is one sample: its
    variance across the condition's reps (shorts of one run move together, a loaded host slows them all, so their
    covariance counts) over the reps, times the weight squared, summed over the conditions (runs independent). A
    short without the figure in a run counts at its condition mean. Needs per-run values (`with_run_values`)."""
    specs = list(specs)
    var = 0.0
    for label, weight in weights.items():
        runs = [r for r in truth["runs"] if r.get("accepted") and r["condition"] == label]
        if weight == 0 or not specs or not runs:
            continue
        means = {s: truth["shorts"][s]["conditions"][label][metric]["mean"] for s in specs}
        sums = []
        for run in runs:
            if "values" not in run:
                raise LabError(f"run {label} rep {run.get('rep')}: no per-short values and no kept recording; "
                               "the truth's standard error needs them")
            sums.append(sum(run["values"].get(s, {}).get(metric, means[s]) for s in specs))
        if len(sums) > 1:
            var += weight**2 * statistics.variance(sums) / len(sums)
    return math.sqrt(var)


def short_shapley_se(truth: Mapping[str, Any], spec: str, metric: str = "ttft_s") -> dict[str, float]:
    """Per whale, the standard error of its Shapley share of one short's `metric` (`effect_se` of that short)."""
    weights = shapley_weights(tuple(sorted(truth["whales"])))
    return {w: effect_se(truth, {c: per[w] for c, per in weights.items()}, [spec], metric) for w in truth["whales"]}


def whale_truths(truth: Mapping[str, Any], metric: str, blamed: Mapping[str, Mapping[str, float]], reps: int,
                 specs: Iterable[str]) -> dict[str, WhaleTruth]:
    """Per whale, its true Shapley share of `metric` summed over `specs`, clipped and net (`WhaleTruth`), the net
    sum's standard error (`effect_se`: from the runs' sums, shorts of a run correlated) and the blame summed over
    the same shorts (blamed[short][whale], summed over `reps` runs). For ITL, a mid-stream stall (a preemption) or
    decoding beside a prefill shows."""
    whales = sorted(truth["whales"])
    weights = shapley_weights(tuple(whales))
    true, net, got = (dict.fromkeys(whales, 0.0) for _ in range(3))
    kept = []
    for spec in specs:
        shap: Mapping[str, float] = truth["shorts"][spec]["shapley"].get(metric, {})
        if not shap:
            continue
        kept.append(spec)
        for w in whales:
            true[w] += max(0.0, shap.get(w, 0.0))
            net[w] += shap.get(w, 0.0)
            got[w] += blamed.get(spec, {}).get(w, 0.0) / reps
    return {w: WhaleTruth(true[w], net[w], effect_se(truth, {c: per[w] for c, per in weights.items()}, kept, metric),
                          got[w]) for w in whales}


def _rel_errors(whales: Mapping[str, WhaleTruth]) -> dict[str, float]:
    """Per whale with a true share, |blamed - true| / true: the error the score has always printed."""
    return {w: t.rel_error for w, t in whales.items() if t.true_s > 0}


def format_scores(scores: list[Score]) -> str:
    def pct(x: float | None) -> str:
        return "-" if x is None else f"{100 * x:.0f} %"

    def noise(whales: Mapping[str, WhaleTruth]) -> str:
        unresolved = [w for w, t in whales.items() if t.true_s > 0 and not t.resolved]
        return f"{len(_within_noise(whales))}/{len(unresolved)}" if whales else "-"

    head = (f"{'':<24} {'top-1 agreement':>16} {'median |err| per whale':>24} {'null false alarms':>18}"
            f" {'ITL |err| per whale':>20} {'resolved':>9} {'in noise':>9} {'ITL resolved':>13} {'ITL in noise':>13}")
    lines = [head]
    for s in scores:
        lines.append(f"{s.name:<24} {pct(s.top1):>10} ({s.top1_hits}/{s.top1_total})"
                     f" {pct(s.median_whale_error):>24} {pct(s.null_false_alarm):>12}"
                     f" ({s.null_flagged}/{s.null_total}) {pct(s.median_itl_whale_error):>13}"
                     f" {pct(s.median_whale_error_resolved):>9} {noise(s.whales):>9}"
                     f" {pct(s.median_itl_whale_error_resolved):>13} {noise(s.itl_whales):>13}")
    lines.append("goals: top-1 >= 95 % on shorts slowed >= 2x; median error <= 20 %; null false alarms <= 5 %"
                 " (errors of summed TTFT shares; ITL: of the shorts' mean ITL)")
    lines.append(f"resolved: the median error over the whales whose true share is >= {RESOLVED_SE:g} of its standard"
                 " errors (the truth's reps); in noise: of the unresolved whales, those blamed within that of it")
    return "\n".join(lines)


@functools.lru_cache(maxsize=64)
def replayed_timeline(path: Path) -> Any:
    """The timeline of one recording's replay, once: attribution and the step-truth score both read it. It keeps the
    whole recording (no `keep_s` window): the score attributes after the replay, where a live agent attributes each
    request as it finishes, so the live window of 30 s would drop every request but the last 30 s' (nu17: a
    continuous truth kept 25-29 of its 41-42 requests, a 2.5-minute recording 8,019 of its 23,251 steps)."""
    from attrib_agent.sources.replay import ReplaySource
    from attrib_agent.timeline.engine_timeline import EngineTimeline

    tl = EngineTimeline(keep_s=math.inf)
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
