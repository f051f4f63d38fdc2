"""What one co-member adds to a step: the same decodes' step time with and without k more decoders or one chunk.

Reads a recording of the `marginal` scenario (two long decodes; beside them, now and then, a burst of k short
decoders or one prefill alone): vLLM's own `Iteration(N)` lines give each step's make-up (context requests and
tokens, generation requests) and its elapsed time; with the step plugin (`--truth-plugin`) the period to the next
step's scheduling is read too (the elapsed time plus vLLM's work between steps, what a decoding victim waits).
Each episode (a run of steps with one make-up that is not the base's) is compared with the base-only steps
around it, so the decodes' own slow growth with their context cancels; episodes are the repetitions.
"""

from __future__ import annotations

import json
import statistics
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attrib_agent.recording import LOG, VLLM_STEPS, Recording
from attrib_agent.sources.log.patterns import ITERATION

_AROUND = 40  # base-only steps read on each side of an episode for its reference
_MIN_STEPS = 3  # an episode shorter than this (a burst's arrival or last step) is not timed


@dataclass(frozen=True, slots=True)
class Step:
    iteration: int
    ctx_requests: int
    ctx_tokens: int
    gen_requests: int
    elapsed_ms: float
    period_ms: float | None  # to the next step's scheduling (plugin), None without it or at a pause


@dataclass(frozen=True, slots=True)
class Episode:
    """One make-up beside the base decodes: `extra` decoders, or one prefill of `chunk` tokens."""

    kind: str  # "decode" or "prefill"
    size: int  # extra decoders, or the chunk's tokens
    steps: int
    elapsed_delta_ms: float  # median elapsed minus the surrounding base-only median
    period_delta_ms: float | None


def iteration_steps(rec: Recording) -> list[Step]:
    """Every logged step in order, with its period from the plugin's scheduling times when recorded."""
    sched: dict[int, float] = {}
    if rec.has(VLLM_STEPS):
        for m in rec.records(VLLM_STEPS):
            if m.get("kind") == "step" and isinstance(m.get("iter"), int) and isinstance(m.get("t"), (int, float)):
                sched[m["iter"]] = float(m["t"])
    rows = []
    for r in rec.records(LOG):
        line = ITERATION.search(str(r.get("line", "")))
        if line is None or line.group("dummy"):
            continue
        it = int(line.group("iteration"))
        nxt = sched.get(it + 1)
        period = (nxt - sched[it]) * 1000 if nxt is not None and it in sched else None
        rows.append(Step(it, int(line.group("ctx_reqs")), int(line.group("ctx_tokens")),
                         int(line.group("gen_reqs")), float(line.group("elapsed")), period))
    rows.sort(key=lambda s: s.iteration)
    return rows


def episodes(steps: Sequence[Step], base: int) -> list[Episode]:
    """Runs of one make-up beside `base` decodes: `base + k` decoders alone, or `base` decoders beside one prefill
    request (whose chunk is the context tokens), each against the base-only steps around it."""
    is_base = [s.ctx_requests == 0 and s.gen_requests == base for s in steps]
    out = []
    i = 0
    while i < len(steps):
        key = _kind(steps[i], base)
        j = i
        while j < len(steps) and key is not None and _kind(steps[j], base) == key and _same(steps[j], steps[i]):
            j += 1
        if key is None or j - i < (1 if key == "prefill" else _MIN_STEPS):
            i = max(j, i + 1)
            continue
        run = steps[i + (0 if key == "prefill" else 1):j - (0 if key == "prefill" else 1)]  # arrival/finish steps
        lo = max(0, i - 4 * _AROUND)
        before = [s for s, b in zip(steps[lo:i], is_base[lo:i], strict=True) if b]
        after = [s for s, b in zip(steps[j:j + 4 * _AROUND], is_base[j:j + 4 * _AROUND], strict=True) if b]
        n = min(len(before), len(after), _AROUND) or _AROUND  # as many each side, so a drift cancels
        ref = before[len(before) - n:] + after[:n]
        if len(ref) >= _MIN_STEPS and run:
            size = steps[i].ctx_tokens if key == "prefill" else steps[i].gen_requests - base
            out.append(Episode(key, size, len(run), _median_delta(run, ref, "elapsed_ms"),
                               _median_delta(run, ref, "period_ms")))
        i = j
    return out


def _kind(s: Step, base: int) -> str | None:
    if s.ctx_requests == 0 and s.gen_requests > base:
        return "decode"
    if s.ctx_requests == 1 and s.gen_requests == base:
        return "prefill"
    return None


def _same(a: Step, b: Step) -> bool:
    return a.gen_requests == b.gen_requests and a.ctx_tokens == b.ctx_tokens


def _median_delta(run: Sequence[Step], ref: Sequence[Step], field: str) -> Any:
    xs = [v for s in run if (v := getattr(s, field)) is not None]
    ys = [v for s in ref if (v := getattr(s, field)) is not None]
    return statistics.median(xs) - statistics.median(ys) if xs and ys else None


def summary(eps: Iterable[Episode]) -> dict[str, dict[int, dict[str, Any]]]:
    """Per kind and size: the episodes' deltas (ms), their median (a step the busy machine stalled moves the mean),
    mean and range, and per extra decoder for decodes."""
    groups: dict[tuple[str, int], list[Episode]] = defaultdict(list)
    for e in eps:
        groups[(e.kind, e.size)].append(e)
    out: dict[str, dict[int, dict[str, Any]]] = defaultdict(dict)
    for (kind, size), es in sorted(groups.items()):
        row: dict[str, Any] = {"episodes": len(es), "steps": sum(e.steps for e in es)}
        for name in ("elapsed_delta_ms", "period_delta_ms"):
            vals = [v for e in es if (v := getattr(e, name)) is not None]
            if vals:
                row[name] = {"median": statistics.median(vals), "mean": statistics.fmean(vals), "min": min(vals),
                             "max": max(vals), "each": [round(v, 2) for v in vals]}
                if kind == "decode":
                    row[name]["per_request_median"] = statistics.median(vals) / size
                    row[name]["per_request_mean"] = statistics.fmean(vals) / size
        out[kind][size] = row
    return dict(out)


def measure(paths: Iterable[Path], base: int = 2) -> dict[str, Any]:
    eps: list[Episode] = []
    base_ms: list[float] = []
    for p in paths:
        steps = iteration_steps(Recording(p))
        eps += episodes(steps, base)
        base_ms += [s.elapsed_ms for s in steps if s.ctx_requests == 0 and s.gen_requests == base]
    return {"base_decodes": base, "base_step_ms_median": statistics.median(base_ms) if base_ms else None,
            "base_steps": len(base_ms), **summary(eps)}


def format_measure(m: Mapping[str, Any]) -> str:
    lines = [f"{m['base_decodes']} base decodes alone: step median {m['base_step_ms_median']:.2f} ms over"
             f" {m['base_steps']} steps" if m["base_step_ms_median"] is not None else "no base-only steps"]
    for kind, label in (("decode", "+k decoders"), ("prefill", "+1 prefill chunk")):
        for size, row in sorted(m.get(kind, {}).items()):
            parts = []
            for name, what in (("elapsed_delta_ms", "elapsed"), ("period_delta_ms", "period")):
                d = row.get(name)
                if d:
                    per = f", {d['per_request_median']:.2f} a decoder" if "per_request_median" in d else ""
                    parts.append(f"{what} +{d['median']:.2f} ms [{d['min']:.2f}, {d['max']:.2f}]{per}")
            lines.append(f"{label} {size:>5}: {row['episodes']} episodes, {row['steps']} steps: " + "; ".join(parts))
    return "\n".join(lines)



def add_arguments(p: Any) -> None:
    p.add_argument("recordings", type=Path, nargs="+", metavar="RECORDING",
                   help="recordings of `lab record --scenario marginal` (with --truth-plugin for step periods)")
    p.add_argument("--json", action="store_true")


def run(args: Any) -> int:
    m = measure(args.recordings)
    print(json.dumps(m, indent=1) if args.json else format_measure(m))
    return 0
