"""Score the attribution's causes and preemption naming against vLLM's own per-step account (the step plugin).

For every step of a victim's life the plugin says whether it ran, waited, or was preempted, and why the queue's
head waited. Each culprit's truth label per step, in vLLM's terms (docs/attribution.md, "Causes by mechanism"):
- the victim preempted and not yet back to where it was: `preemption`, on the requests holding blocks;
- the victim waiting while the head did not fit (`no_free_blocks`): `kv_pressure` on the holders, plus
  `head_of_line` on that head when it is another request;
- otherwise (waiting on the budget, or running): `prefill_contention` on the step's chunks, `decode` on its decodes,
  each by what it added to the step (lab/step_marginals.py, fitted on the recording's own steps): a decoding
  neighbour adds ~1 ms to an ~11 ms step, a 256-token chunk ~18 ms (`lab marginal`), so giving every co-member the
  whole step, as this did before, labelled decoding neighbours 10-30x too heavily.
`decode` is `decode_batching` or `kv_bandwidth`: the plugin sees a decode, not what share of it was memory traffic.
A culprit's blamed seconds in a phase (TTFT; ITL over the victim's gaps) agree as far as its causes' split overlaps
the split of its truth labels (and, more leniently, all of them when the main cause of each side is the same).
Preemption naming: a result names `preemption` when the victim stalled (`preempted_s`) or a culprit's seconds
carry the cause; the truth is who the plugin saw preempted. Both ways for `preemption` and `kv_pressure` (NAMED):
per victim (a culprit's seconds carry the cause / some step labels it) and per (victim, culprit, phase) pair, so a
victim blamed on KV pressure counts as right only where the plugin saw it wait for blocks those culprits held.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from attrib_agent.attribution.result import AttributionResult, Cause, itl_gaps
from attrib_agent.lab.step_marginals import StepMarginals, fit, members
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.vllm_ids import external_id

DECODE = "decode"  # the plugin's view of decode_batching and kv_bandwidth together
_SAME = {Cause.DECODE_BATCHING.value: DECODE, Cause.KV_BANDWIDTH.value: DECODE}
_Labels = dict[str, dict[str, dict[str, float]]]  # phase -> culprit -> cause -> seconds of step time
NAMED = (Cause.PREEMPTION.value, Cause.KV_PRESSURE.value)  # the causes an operator acts on by name


@dataclass
class Naming:
    """How often the attribution names one cause where vLLM's steps show it, and the other way round."""

    named: int = 0
    true: int = 0
    hits: int = 0

    def count(self, named: bool, true: bool) -> None:
        self.named += named
        self.true += true
        self.hits += named and true

    def add(self, other: Naming) -> None:
        self.named, self.true, self.hits = self.named + other.named, self.true + other.true, self.hits + other.hits

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "precision": self.hits / self.named if self.named else None,
                "recall": self.hits / self.true if self.true else None}


def _namings() -> dict[str, Naming]:
    return {c: Naming() for c in NAMED}


@dataclass
class CauseAgreement:
    blamed_s: float = 0.0  # blamed seconds of culprits the plugin saw in the victim's steps
    agree_s: float = 0.0  # ... whose cause matches the truth's labels
    dominant_agree_s: float = 0.0  # ... of culprits whose main cause (by seconds) is the truth's main label
    unseen_s: float = 0.0  # blamed seconds on culprits the plugin never saw beside the victim
    preempted_true: int = 0  # victims (with a result) the plugin saw preempted
    preempted_named: int = 0  # results naming `preemption`
    preempted_hits: int = 0
    victims: dict[str, Naming] = field(default_factory=_namings)  # per victim, by cause in NAMED
    pairs: dict[str, Naming] = field(default_factory=_namings)  # per (victim, culprit, phase), by cause in NAMED

    @property
    def share(self) -> float | None:
        return self.agree_s / self.blamed_s if self.blamed_s > 0 else None

    @property
    def dominant_share(self) -> float | None:
        return self.dominant_agree_s / self.blamed_s if self.blamed_s > 0 else None

    @property
    def precision(self) -> float | None:
        return self.preempted_hits / self.preempted_named if self.preempted_named else None

    @property
    def recall(self) -> float | None:
        return self.preempted_hits / self.preempted_true if self.preempted_true else None

    def add(self, other: CauseAgreement) -> None:
        for k, v in asdict(other).items():
            if isinstance(v, int | float):
                setattr(self, k, getattr(self, k) + v)
        for mine, theirs in ((self.victims, other.victims), (self.pairs, other.pairs)):
            for c, n in theirs.items():
                mine.setdefault(c, Naming()).add(n)

    def as_dict(self) -> dict[str, Any]:
        return {**asdict(self), "share": self.share, "dominant_share": self.dominant_share,
                "victims": {c: n.as_dict() for c, n in self.victims.items()},
                "pairs": {c: n.as_dict() for c, n in self.pairs.items()},
                "preemption_precision": self.precision,
                "preemption_recall": self.recall}


def step_messages(rec: Recording) -> list[Mapping[str, Any]]:
    return [m for m in rec.records(VLLM_STEPS) if m.get("v") == 1 and m.get("kind") == "step"
            and isinstance(m.get("t"), (int, float))]


def truth_labels(victim: str, lc: RequestLifecycle, steps: Sequence[Mapping[str, Any]],
                 prices: StepMarginals | None = None) -> tuple[_Labels, bool]:
    """Per phase, each other request's causes by step time over the victim's life; and whether it was preempted.
    With `prices`, a step the victim ran in or waited on the budget through is split by what each member added
    to it; without, every other member is given the whole step."""
    labels: _Labels = {p: defaultdict(lambda: defaultdict(float)) for p in ("ttft", "itl")}
    t0, t1 = lc.arrival_ts, lc.end_ts
    stalled = preempted = False
    if t0 is None or t1 is None:
        return labels, False
    for k, m in enumerate(steps):
        t = float(m["t"])
        dt = (float(steps[k + 1]["t"]) if k + 1 < len(steps) else float(m.get("ts", t))) - t
        ran = {external_id(s["id"]): int(s.get("new", 0)) for s in m.get("scheduled", ())}
        if any(external_id(r) == victim for r in m.get("preempted", ())):
            stalled = preempted = True
        elif stalled and ran.get(victim) == 1:
            stalled = False  # decoding again: the context it held is rebuilt
        dt = min(t + dt, t1) - max(t, t0)  # the step's time within the victim's life (it may arrive mid-step)
        if dt <= 0:
            continue
        phase = "ttft" if lc.first_token_ts is None or t < lc.first_token_ts else "itl"
        holders = [external_id(r) for r in (m.get("blocks") or {}) if external_id(r) != victim]
        head = m.get("head") or {}
        by = labels[phase]
        if stalled:
            for h in holders:
                by[h][Cause.PREEMPTION.value] += dt
        elif victim not in ran and head.get("reason") == "no_free_blocks":
            for h in holders:
                by[h][Cause.KV_PRESSURE.value] += dt
            if head.get("id") and external_id(head["id"]) != victim:
                by[external_id(head["id"])][Cause.HEAD_OF_LINE.value] += dt
        else:
            for rid, part in _parts(victim, m, prices).items():
                if part > 0:
                    by[rid][Cause.PREFILL_CONTENTION.value if ran[rid] > 1 else DECODE] += dt * part
    return labels, preempted


def _parts(victim: str, step: Mapping[str, Any], prices: StepMarginals | None) -> dict[str, float]:
    """Each other member's part of the step's time: what it added (its price over the step's) when the victim ran
    in it; when the victim waited, the whole step, split by what each added (equally if nothing was priced)."""
    ms = members(step)
    if prices is None:
        return {rid: 1.0 for rid in ms if rid != victim}
    shares = prices.shares(ms)
    if victim in ms:
        return {rid: f for rid, f in shares.items() if rid != victim}
    total = sum(shares.values())
    return {rid: f / total if total > 0 else 1.0 / len(shares) for rid, f in shares.items()}


def _overlap(seconds: float, causes: Mapping[str, float], truth: Mapping[str, float]) -> tuple[float, float]:
    """Of `seconds` split by `causes`' weights, how much falls on causes the truth's split gives as much; and all of
    them when the main cause of each side is the same, else 0."""
    mine: dict[str, float] = defaultdict(float)
    for c, w in causes.items():
        mine[_SAME.get(c, c)] += w
    mt, tt = sum(mine.values()), sum(truth.values())
    if seconds <= 0 or mt <= 0 or tt <= 0:
        return 0.0, 0.0
    same = max(mine, key=lambda c: mine[c]) == max(truth, key=lambda c: truth[c])
    return seconds * sum(min(w / mt, truth.get(c, 0.0) / tt) for c, w in mine.items()), seconds if same else 0.0


def _names_preemption(r: AttributionResult) -> bool:
    return r.preempted_s > 0 or any(Cause.PREEMPTION.value in c.causes or Cause.PREEMPTION.value in c.itl_causes
                                    for c in r.culprits)


def agreement(results: Iterable[AttributionResult], lifecycles: Mapping[str, RequestLifecycle],
              steps: Sequence[Mapping[str, Any]], prices: StepMarginals | None = None) -> CauseAgreement:
    """`prices`: what each member adds to a step (step_marginals.fit of the same steps); None: the whole step."""
    out = CauseAgreement()
    for r in results:
        lc = lifecycles.get(r.request_id)
        if lc is None:
            continue
        labels, preempted = truth_labels(r.request_id, lc, steps, prices)
        named = _names_preemption(r)
        out.preempted_true += preempted
        out.preempted_named += named
        out.preempted_hits += preempted and named
        gaps = itl_gaps(r.completion_tokens)
        said: set[str] = {Cause.PREEMPTION.value} if named else set()
        seen = {Cause.PREEMPTION.value} if preempted else set()
        blamed = {(phase, c.request_id): causes for c in r.culprits
                  for phase, seconds, causes in (("ttft", c.ttft_s, c.causes), ("itl", c.itl_s * gaps, c.itl_causes))
                  if seconds > 0}
        for phase, by in labels.items():
            for culprit, truth_causes in by.items():
                for cause in NAMED:
                    t, n = truth_causes.get(cause, 0.0) > 0, blamed.get((phase, culprit), {}).get(cause, 0.0) > 0
                    out.pairs[cause].count(n, t)
                    seen |= {cause} if t else set()
        for (phase, culprit), causes in blamed.items():
            for cause in NAMED:
                if causes.get(cause, 0.0) > 0:
                    said.add(cause)
                    if culprit not in labels[phase]:
                        out.pairs[cause].count(True, False)  # named on a culprit the plugin never saw beside it
        for cause in NAMED:
            out.victims[cause].count(cause in said, cause in seen)
        for c in r.culprits:
            for phase, seconds, causes in (("ttft", c.ttft_s, c.causes), ("itl", c.itl_s * gaps, c.itl_causes)):
                if seconds <= 0:
                    continue
                truth = labels[phase].get(c.request_id)
                if not truth:
                    out.unseen_s += seconds
                    continue
                agree, dominant = _overlap(seconds, causes, truth)
                out.blamed_s += seconds
                out.agree_s += agree
                out.dominant_agree_s += dominant
    return out


def score_recording(path: Path) -> CauseAgreement | None:
    """The attribution of one recording (as `lab score` makes it) against its plugin stream; None without one."""
    from attrib_agent.lab.score import attributed

    rec = Recording(path)
    if not rec.has(VLLM_STEPS):
        return None
    results, lcs, _ = attributed(path)
    steps = sorted(step_messages(rec), key=lambda m: float(m["t"]))
    return agreement(results, lcs, steps, fit(steps))


def score_dir(recordings: Iterable[Path]) -> CauseAgreement | None:
    total: CauseAgreement | None = None
    for path in recordings:
        s = score_recording(path)
        if s is not None:
            total = total or CauseAgreement()
            total.add(s)
    return total
