"""Score the admission forecast against the lab's counterfactual truth.

For each whale w of a truth, the whales that arrived before it are its context ("prev"). The true harm of
admitting w is what the truth measured between the worlds prev + w and prev: per short, the mean TTFT with minus
without (negatives count 0), summed over shorts. The forecast is made from a recording of the world prev + w,
replayed through the pipeline up to the event before w's `Received request` line: the state the agent had when w
arrived. Two loads are scored: `learnt` (the agent's own estimate from recent arrivals, all a live agent has)
and `declared` (the short stream's rate, size and phase over its remaining span, and the prompt lengths of the
requests in flight, as a router that knows its traffic and what it sent would pass them). Only harm to shorts is
compared: the truth measures nothing else.

`persisted`: each recording's agent starts from the step-cost fit that the agent which replayed the truth's
previous recording left in its `state_dir` (agent/fit_store.py): the same machine and vLLM, an earlier run, as
a restarted sidecar would find it. The chain runs in the truth's run order; its first recording starts cold.
"""

from __future__ import annotations

import asyncio
import copy
import json
import statistics
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.fit_store import state_file
from attrib_agent.agent.replay import replay_into
from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.attribution.fit_snapshot import decode
from attrib_agent.attribution.forecast import ArrivalLoad, Candidate, Forecast, ForecastConfig, forecast
from attrib_agent.attribution.forecast_state import engine_state, forecast_cost
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import RequestReceived
from attrib_agent.lab.score import RESOLVED_SE, SLOWED_RATIO, effect_se, is_resolved, spec_ids, with_run_values
from attrib_agent.lab.server import LabError
from attrib_agent.lab.workload import LILO, LISO, RAG, RAG_PREFIXES, SILO, SISO
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import Recording
from attrib_agent.sources.replay import ReplaySource

LOADS = ("learnt", "declared")
CLASSES = {c.name: c for c in (SISO, SILO, LISO, LILO, RAG)}  # the class names truth.json gives its shorts
# Prompt tokens a class shares with the others of its stream (RAG: the system prompt and one of the documents),
# in vLLM's prefix cache once the stream is under way: what a router that knows its traffic declares.
SHARED_PREFIX = {RAG.name: sum(n for _, n in RAG_PREFIXES[0])}


@dataclass
class WhaleCase:
    truth: str  # truth directory name
    whale: str
    context: tuple[str, ...]  # whales present before it
    true_harm_s: float
    true_slowed_2x: bool  # some short's TTFT at least doubled
    true_resolved_2x: bool = False  # ... and that short's with-minus-without is resolved (`is_resolved`)
    done_before: int = 0  # shorts left out: their first token came before the whale was sent, in every rep
    done_before_s: float = 0.0  # ... and what the truth's with/without difference gave them (run-to-run noise)
    true_se_s: float = 0.0  # standard error of the net harm: from the runs' sums over the same shorts (`effect_se`)
    forecast_s: dict[str, list[float]] = field(default_factory=lambda: {k: [] for k in LOADS})
    harmless: dict[str, list[bool]] = field(default_factory=lambda: {k: [] for k in LOADS})  # the verdicts
    # ... and whether the whale's prefill was priced beyond what the fit had seen (`Forecast.extrapolated`)
    extrapolated: dict[str, list[bool]] = field(default_factory=lambda: {k: [] for k in LOADS})
    fits: Counter[str] = field(default_factory=Counter)  # persisted: what became of each recording's saved fit
    true_net_s: float = 0.0  # true_harm_s unclipped: the with-minus-without summed as it is, what `resolved` judges
    victims: tuple[str, ...] = ()  # the shorts summed: those still without a first token when the whale was sent

    @property
    def truly_harmless(self) -> bool:
        """No short slowed 2x and a harm the truth cannot tell from none: what a forecast should call harmless."""
        return not self.true_slowed_2x and not self.resolved

    @property
    def resolved(self) -> bool:
        """Whether the truth tells this harm from none (`is_resolved`, the net harm, as `lab score` judges a share):
        a relative error against an unresolved harm scores the truth's run-to-run noise as much as the forecast."""
        return is_resolved(self.true_net_s, self.true_se_s)

    def mean(self, load: str) -> float | None:
        xs = self.forecast_s[load]
        return statistics.fmean(xs) if xs else None


def _label(whales: Iterable[str]) -> str:
    return "+".join(sorted(whales)) or "none"


def whale_cases(truth_dir: Path) -> tuple[dict[str, Any], list[WhaleCase]]:
    """The whales of a truth in arrival order, each with its true harm: summed over the shorts the whale could
    have delayed, those still without a first token when it was sent. A short served before (its offset plus its
    longest TTFT over the reps with the whale) cannot be the whale's victim; the truth's with/without difference
    for it is the two conditions' run-to-run noise, which `max(., 0)` turns into harm (continuous/w2: 1.43 of
    its 1.66 s came from shorts served 3-24 s before it was sent), and the forecast, which cannot reach back,
    gives it none."""
    path = truth_dir / "truth.json"
    if not path.is_file():
        raise LabError(f"{truth_dir}: no truth.json")
    truth = with_run_values(json.loads(path.read_text()), truth_dir)
    whales: Mapping[str, Any] = truth["whales"]
    order = sorted(whales, key=lambda w: (whales[w]["offset_s"], w))
    cases = []
    for i, w in enumerate(order):
        prev = tuple(order[:i])
        with_, without = _label((*prev, w)), _label(prev)
        case = WhaleCase(truth_dir.name, w, prev, 0.0, False)
        weights = {with_: 1.0, without: -1.0}
        victims = []
        for spec, entry in truth["shorts"].items():
            cond = entry["conditions"]
            if "ttft_s" not in cond.get(with_, {}) or "ttft_s" not in cond.get(without, {}):
                continue
            a, b = cond[with_]["ttft_s"]["mean"], cond[without]["ttft_s"]["mean"]
            if entry["offset_s"] + cond[with_]["ttft_s"]["max"] < whales[w]["offset_s"]:
                case.done_before += 1  # its first token preceded the whale in every rep: not the whale's doing
                case.done_before_s += max(a - b, 0.0)
                continue
            victims.append(spec)
            case.true_harm_s += max(a - b, 0.0)
            case.true_net_s += a - b
            case.true_slowed_2x |= a >= SLOWED_RATIO * b
            case.true_resolved_2x |= a >= SLOWED_RATIO * b and is_resolved(
                a - b, effect_se(truth, weights, [spec], "ttft_s"))
        case.true_se_s = effect_se(truth, weights, victims, "ttft_s")
        case.victims = tuple(victims)
        cases.append(case)
    return truth, cases


def declared_load(truth: Mapping[str, Any], at_offset_s: float) -> tuple[ArrivalLoad, float] | None:
    """The short stream still to come after `at_offset_s`: (rate, size and when the next one comes, its
    remaining span)."""
    shorts = sorted(truth["shorts"].values(), key=lambda e: e["offset_s"])
    later = [e for e in shorts if e["offset_s"] > at_offset_s]
    if len(shorts) < 2 or not later:
        return None
    rate = (len(shorts) - 1) / (shorts[-1]["offset_s"] - shorts[0]["offset_s"])
    unknown = sorted({e["class"] for e in later} - set(CLASSES))
    if unknown:
        raise LabError(f"truth's shorts have a class the score does not know: {unknown[0]!r}")
    klasses = [CLASSES[e["class"]] for e in later]  # a mix (continuous traffic): its sizes in turn
    first = later[0]["offset_s"] - at_offset_s
    mix = tuple((k.prompt_tokens, k.output_tokens) for k in klasses)
    cached = int(statistics.median(SHARED_PREFIX.get(k.name, 0) for k in klasses))
    return (ArrivalLoad(rate, int(statistics.median(k.prompt_tokens for k in klasses)),
                        int(statistics.median(k.output_tokens for k in klasses)), first,
                        mix if len(set(mix)) > 1 else (), cached),
            later[-1]["offset_s"] - at_offset_s + 0.5 / rate)


def forecast_at_arrival(recording: Path, whale: str, candidate: Candidate, loads: Mapping[str, tuple[
        ArrivalLoad | None, ForecastConfig]], sent: Mapping[str, int], cost: StepCostModel | None = None,
                        state: bytes | None = None, fits: Counter[str] | None = None) -> dict[str, Forecast]:
    """Replay `recording` up to the whale's arrival; one forecast of admitting it per named load. The declared
    one also knows the prompt lengths `sent` (by spec id), as the router that sent them would. `state`: a state
    file's bytes, offered to the pipeline as the agent offers it (adopted at the first scrape if it matches);
    `fits` counts its fate by the time the whale arrives (loaded, mismatch, invalid, pending: not decided yet)."""
    spec = spec_ids(Recording(recording))
    p = AttributionPipeline()
    if cost is not None:
        p.attributor.cost = copy.deepcopy(cost)
    if state is not None:
        seen = fits if fits is not None else Counter()
        p.engine_watch.offer(decode(state), lambda verdict, detail: seen.update([verdict]))
    for ev in ReplaySource(recording).events():
        if isinstance(ev, RequestReceived) and spec.get(ev.request_id) == whale:
            learnt = engine_state(p)
            told = engine_state(p, prompts={rid: sent[s] for rid, s in spec.items() if s in sent})
            if learnt is None or told is None:
                raise LabError(f"{recording}: no event before {whale}'s arrival")
            if fits is not None and p.engine_watch.pending:
                fits["pending"] += 1
            out = {}
            for name, (load, cfg) in loads.items():
                s = learnt if load is None else replace(told, load=load, load_basis="declared")
                out[name] = forecast(s, [candidate], forecast_cost(p), cfg)[0]
            return out
        p.feed(ev)
    raise LabError(f"{recording}: whale {whale} never arrives")


def shorts_harm(f: Forecast, spec: Mapping[str, str], whales: Iterable[str]) -> float:
    """Forecast TTFT harm to shorts: in-flight requests that are not whales, plus every expected arrival."""
    big = set(whales)
    in_flight = sum(s for rid, s in f.in_flight.ttft_extra_by_request if spec.get(rid, rid) not in big)
    return in_flight + f.expected.ttft_extra_sum_s


def warmed_cost(truth: Mapping[str, Any], truth_dir: Path) -> StepCostModel | None:
    """The step-cost model an agent would have fitted watching this server before: from the truth's first
    null run (shorts alone, same machine and vLLM). The recordings start with the agent cold."""
    run = next((r for r in truth["runs"] if r["condition"] == "none" and r.get("accepted") and r.get("recording")),
               None)
    if run is None:
        return None
    p = AttributionPipeline()
    p.feed_all(list(ReplaySource(truth_dir / run["recording"]).events()))
    p.attributor.learn(p.timeline)
    return p.attributor.cost


def persisted_states(truth: Mapping[str, Any], truth_dir: Path) -> dict[str, bytes | None]:
    """By recording: the state file its agent found at start, as the agent that replayed the truth's previous
    recording (run order) left it in their shared `state_dir`; None for the first. Each agent is the real one
    (`AgentCore.from_config` with `state_dir`, a replay, shutdown), so what it saved is what a restart loads."""
    out: dict[str, bytes | None] = {}
    with tempfile.TemporaryDirectory(prefix="attrib-fit-") as tmp:
        path = state_file(Path(tmp), 0)
        for run in truth["runs"]:
            if not run.get("recording") or not (truth_dir / run["recording"]).exists():
                continue
            out[run["recording"]] = path.read_bytes() if path.exists() else None
            core = AgentCore.from_config(AgentConfig(state_dir=Path(tmp)), live=False)
            asyncio.run(replay_into(core, truth_dir / run["recording"]))
            core.shutdown()
    return out


def self_fitted_cost(recording: Path) -> StepCostModel:
    """A diagnostic, not a forecast an agent could make: the step-cost model fitted on the whole recording
    being scored (the whale's own steps included), which isolates the cost model from the rest."""
    p = AttributionPipeline()
    p.feed_all(list(ReplaySource(recording).events()))
    p.attributor.learn(p.timeline)
    p.attributor.cost.refit()
    return p.attributor.cost


def score_dirs(truth_dirs: Iterable[Path], config: ForecastConfig | None = None, *, warm: bool = False,
               self_fit: bool = False, persisted: bool = False) -> list[WhaleCase]:
    cfg = config or ForecastConfig()
    out = []
    for d in truth_dirs:
        truth, cases = whale_cases(d)
        cost = warmed_cost(truth, d) if warm else None
        states = persisted_states(truth, d) if persisted else {}
        for case in cases:
            w = truth["whales"][case.whale]
            declared = declared_load(truth, w["offset_s"])
            loads: dict[str, tuple[ArrivalLoad | None, ForecastConfig]] = {"learnt": (None, cfg)}
            if declared is not None:
                loads["declared"] = (declared[0], replace(cfg, horizon_s=declared[1]))
            runs = [r for r in truth["runs"] if r.get("accepted") and r.get("recording")
                    and r["condition"] == _label((*case.context, case.whale))]
            if not runs:
                raise LabError(f"{d}: no kept recording of {_label((*case.context, case.whale))}")
            for run in runs:
                rec = d / run["recording"]
                sent = {k: v["prompt_tokens"] for k, v in truth["whales"].items()}
                sent |= {k: CLASSES[v["class"]].prompt_tokens for k, v in truth["shorts"].items()}
                got = forecast_at_arrival(rec, case.whale, Candidate(w["prompt_tokens"], w["output_tokens"]), loads,
                                          sent, self_fitted_cost(rec) if self_fit else cost,
                                          states.get(run["recording"]), case.fits)
                spec = spec_ids(Recording(rec))
                for name, f in got.items():
                    case.forecast_s[name].append(shorts_harm(f, spec, truth["whales"]))
                    case.harmless[name].append(f.harmless(cfg))
                    case.extrapolated[name].append(f.extrapolated)
            out.append(case)
    return out


def spearman(xs: list[float], ys: list[float]) -> float | None:
    """Rank correlation (average ranks for ties); None with fewer than 3 points or no spread."""
    if len(xs) < 3:
        return None

    def ranks(v: list[float]) -> list[float]:
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = statistics.fmean(rx), statistics.fmean(ry)
    sxy = sum((a - mx) * (b - my) for a, b in zip(rx, ry, strict=True))
    sxx, syy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return None if sxx == 0 or syy == 0 else sxy / (sxx * syy) ** 0.5


def summary(cases: list[WhaleCase], load: str) -> dict[str, Any]:
    """Median relative error of the summed harm (over all whales, and over those whose truth is resolved), rank
    correlation, and the never-harmless-when-2x rule: a whale is called harmless when the forecast's own verdict
    (`Forecast.harmless`, what the endpoint answers) says so from any of its recordings; the same over the 2x
    slowdowns the truth resolves (>= RESOLVED_SE standard errors: a single rep's stall is not), and the other
    side, specificity: of the truly harmless whales (no short 2x, harm unresolved), those called harmless in
    every recording. A verdict that is never "harmless" passes the first rule and fails this one. Also how many
    forecasts priced the whale's prefill beyond the fit's evidence (never harmless, `Forecast.harmless`)."""
    pairs = [(c, m) for c in cases if (m := c.mean(load)) is not None]
    errors = [(abs(m - c.true_harm_s) / c.true_harm_s, c.resolved) for c, m in pairs if c.true_harm_s > 0]
    resolved = [e for e, ok in errors if ok]
    missed = [f"{c.truth}/{c.whale}" for c, _ in pairs if c.true_slowed_2x and any(c.harmless[load])]
    harmless = [c for c, _ in pairs if c.truly_harmless]
    return {"load": load, "whales": len(pairs),
            "median_rel_error": statistics.median(e for e, _ in errors) if errors else None,
            "resolved_whales": len(resolved),
            "median_rel_error_resolved": statistics.median(resolved) if resolved else None,
            "rank_correlation": spearman([m for _, m in pairs], [c.true_harm_s for c, _ in pairs]),
            "called_harmless_but_2x": missed,
            "called_harmless_but_resolved_2x": [f"{c.truth}/{c.whale}" for c, _ in pairs
                                                if c.true_resolved_2x and any(c.harmless[load])],
            "truly_harmless": [f"{c.truth}/{c.whale}" for c in harmless],
            "truly_harmless_called_harmless": [f"{c.truth}/{c.whale}" for c in harmless
                                               if c.harmless[load] and all(c.harmless[load])],
            "extrapolated_forecasts": sum(sum(c.extrapolated[load]) for c, _ in pairs),
            "forecasts": sum(len(c.extrapolated[load]) for c, _ in pairs)}


def _summary_line(cases: list[WhaleCase], load: str, label: str) -> str:
    s = summary(cases, load)
    err, res = ("-" if (e := s[k]) is None else f"{100 * e:.0f} %"
                for k in ("median_rel_error", "median_rel_error_resolved"))
    rho = "-" if s["rank_correlation"] is None else f"{s['rank_correlation']:.2f}"
    by = {f"{c.truth}/{c.whale}": c.harmless[load] for c in cases}
    missed = ", ".join(f"{k} ({sum(by[k])} of {len(by[k])} recordings)" for k in s["called_harmless_but_2x"]) or "none"
    return (f"{label}: median |error| {err} ({res} over the {s['resolved_whales']} whose truth is resolved, "
            f"net harm >= {RESOLVED_SE:g} standard errors), rank correlation {rho} over {s['whales']} whales; "
            f"called harmless though a short slowed >= 2x: {missed} (resolved 2x: "
            f"{', '.join(s['called_harmless_but_resolved_2x']) or 'none'}); truly harmless called harmless: "
            f"{len(s['truly_harmless_called_harmless'])} of {len(s['truly_harmless'])} "
            f"({', '.join(s['truly_harmless']) or 'none'}); priced beyond the fit's evidence: "
            f"{s['extrapolated_forecasts']} of {s['forecasts']} forecasts")


def format_report(cases: list[WhaleCase]) -> str:
    lines = [f"{'whale':<16} {'before it':<10} {'true harm s':>11} {'2x short':>8} "
             + " ".join(f"{'forecast ' + k + ' s':>18}" for k in LOADS)]
    for c in cases:
        cells = " ".join(f"{m:>18.2f}" if (m := c.mean(k)) is not None else f"{'-':>18}" for k in LOADS)
        lines.append(f"{c.truth + '/' + c.whale:<16} {_label(c.context):<10} {c.true_harm_s:>11.2f} "
                     f"{'yes' if c.true_slowed_2x else 'no':>8} {cells}")
    lines += [_summary_line(cases, k, f"{k} load") for k in LOADS]
    lines.append("goals: median error <= 25 %; never harmless when the truth shows a short slowed >= 2x")
    return "\n".join(lines)


def format_side_by_side(cold: list[WhaleCase], kept: list[WhaleCase]) -> str:
    """Each whale's forecast from a cold start and from the fit the previous run's agent kept, per load."""
    cols = [(k, name, cases) for k in LOADS for name, cases in (("cold", cold), ("kept", kept))]
    lines = [f"{'whale':<22} {'true harm s':>11} " + " ".join(f"{k + ' ' + name + ' s':>15}" for k, name, _ in cols)]
    for i, c in enumerate(cold):
        cells = " ".join(f"{m:>15.2f}" if (m := cases[i].mean(k)) is not None else f"{'-':>15}"
                         for k, _, cases in cols)
        lines.append(f"{c.truth + '/' + c.whale:<22} {c.true_harm_s:>11.2f} {cells}")
    lines += [_summary_line(cases, k, f"{k} load, {name}") for k, name, cases in cols]
    fits = sum((c.fits for c in kept), Counter())
    lines.append("kept: each recording starts from the fit the agent that replayed the truth's previous recording "
                 "saved (the first of a truth starts cold); saved fits at the whale's arrival: "
                 + (", ".join(f"{k} {n}" for k, n in sorted(fits.items())) or "none"))
    return "\n".join(lines)


def report_command(truth_dirs: list[Path], *, warm: bool, as_json: bool, self_fit: bool = False,
                   persisted: bool = False) -> str:
    """What `attrib-agent lab forecast-score` prints (`self_fit`: the diagnostic of `self_fitted_cost`;
    `persisted`: cold and kept fits side by side)."""
    cases = score_dirs(truth_dirs, warm=warm, self_fit=self_fit)
    kept = score_dirs(truth_dirs, warm=warm, persisted=True) if persisted else None
    if not as_json:
        return format_report(cases) if kept is None else format_side_by_side(cases, kept)
    doc: dict[str, Any] = {"warm": warm, "summaries": [summary(cases, k) for k in LOADS]}
    if kept is not None:
        doc["persisted_summaries"] = [summary(kept, k) for k in LOADS]
    doc["whales"] = [{"truth": c.truth, "whale": c.whale, "context": list(c.context),
                      "true_harm_s": c.true_harm_s, "true_net_s": c.true_net_s, "true_se_s": c.true_se_s,
                      "resolved": c.resolved,
                      "true_slowed_2x": c.true_slowed_2x, "true_resolved_2x": c.true_resolved_2x,
                      "forecast_s": c.forecast_s, "harmless": c.harmless, "extrapolated": c.extrapolated}
                     | ({"persisted_forecast_s": kept[i].forecast_s, "persisted_harmless": kept[i].harmless,
                         "persisted_extrapolated": kept[i].extrapolated}
                        if kept is not None else {})
                     for i, c in enumerate(cases)]
    return json.dumps(doc, indent=1)
