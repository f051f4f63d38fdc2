"""Which request vLLM preempted, and how sure we are.

vLLM 0.32 recomputes preempted requests: their blocks are freed and they go back to the front of the queue.
Nothing names the victim: `vllm:num_preemptions_total` is global and rises only when the victim next
produces a token (the PREEMPTED event rides on its next output), and there is no log line. The step
inference notices a running request missing from a line's counts; the evidence below says how likely that
was a preemption rather than an unreported finish or a mis-inferred membership.
"""

from __future__ import annotations

import bisect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from itertools import pairwise

from attrib_agent.timeline.ledger import MetricsSample
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.timeline.sched_state import StepInput, fact_ms
from attrib_agent.timeline.step_outcome import PreemptionSighting, ResumeSighting, StepOutcome

# How strongly each piece of evidence alone points at a preemption; combined as a noisy-OR.
EVIDENCE_STRENGTH: Mapping[str, float] = {
    "count_gap": 0.5,  # a running request is missing from the line's counts and nobody reported it finished
    "kv_pressure": 0.6,  # the blocks free after the previous step could not cover this step's allocations
    "kv_drop": 0.3,  # the line's KV usage fell by about the blocks it held
    "resumed": 0.5,  # it was later scheduled again to recompute its context
    "counter_rise": 0.7,  # vllm:num_preemptions_total rose in the scrape window of its resumption
    "lifecycle_gap": 0.6,  # its span shows fewer tokens than the steps between its first and last token
}
COUNTER_SILENT_FACTOR = 0.3  # the counter was watched across its resumption and did not rise
# Above a lone count gap: something besides the gap corroborates it and the counter did not count against it.
ACTIONABLE_CONFIDENCE = EVIDENCE_STRENGTH["count_gap"]


@dataclass(frozen=True, slots=True)
class InferredPreemption:
    request_id: str
    preempted_iteration: int
    preempted_ts: float
    resumed_iteration: int | None
    resumed_ts: float | None
    confidence: float  # 0..1
    evidence: tuple[str, ...]  # names from EVIDENCE_STRENGTH, plus "counter_silent" when it counts against

    @property
    def actionable(self) -> bool:
        """Whether an operator may act on it: counted in `attrib_preemptions_inferred_total`, blamed as the
        `preemption` cause, hatched on the page and exported on spans. A lone count gap (0.5) is how a
        mis-inferred membership looks, and a sighting the counter did not confirm (`counter_silent`) is weaker
        still; the timeline still lists them, with their confidence (`EngineTimeline.actionable_preemptions`
        hands out the list once)."""
        return self.confidence > ACTIONABLE_CONFIDENCE


@dataclass(frozen=True, slots=True)
class PreemptionCounts:
    inferred: int
    counted_by_vllm: float  # rise of vllm:num_preemptions_total over the samples held (resets excluded)
    matched_to_counter: int  # inferred preemptions whose resumption the counter confirms


def infer_preemptions(steps: Sequence[tuple[StepInput, StepOutcome]], samples: Sequence[MetricsSample],
                      lifecycles: Mapping[str, RequestLifecycle], *, in_order: bool = False,
                      eventful: Sequence[int] | None = None,
                      end_ms: Sequence[int] | None = None) -> list[InferredPreemption]:
    """`in_order`: the caller knows its steps end in order (a timeline's do), so nothing checks it.
    `eventful`: the positions, in order, of every step with a preemption or a resumption (the others are
    not read then). `end_ms`: with `in_order`, the steps' `end_ms` in order (at least as many as the steps;
    a timeline keeps the list), searched as it is instead of through each step."""
    marked = range(len(steps)) if eventful is None else eventful
    sightings = [(k, p) for k in marked for p in steps[k][1].preemptions]
    resumes = [r for k in marked for r in steps[k][1].resumes]
    if not sightings:
        return []
    deltas = _Deltas(samples)
    confirmed, silent = _counter_matches(resumes, deltas)
    ends = _StepEnds(steps, in_order, end_ms if in_order else None)
    resumed: dict[str, list[ResumeSighting]] = {}
    for r in resumes:
        resumed.setdefault(r.request_id, []).append(r)
    result: list[InferredPreemption] = []
    for k, p in sightings:
        resume = next((r for r in resumed.get(p.request_id, ()) if r.seq > p.seq), None)
        if _refuted(p, resume, lifecycles.get(p.request_id), deltas):
            continue
        evidence = ["count_gap"]
        if p.kv_pressure:
            evidence.append("kv_pressure")
        if _kv_dropped(steps, k, p):
            evidence.append("kv_drop")
        if resume is not None:
            evidence.append("resumed")
            if resume in confirmed:
                evidence.append("counter_rise")
        lc = lifecycles.get(p.request_id)
        if lc is not None and _lifecycle_gap(ends, lc):
            evidence.append("lifecycle_gap")
        doubt = 1.0
        if resume is not None and resume in silent:
            evidence.append("counter_silent")
            doubt = COUNTER_SILENT_FACTOR
        miss = 1.0
        for name in evidence:
            miss *= 1.0 - EVIDENCE_STRENGTH.get(name, 0.0)
        result.append(InferredPreemption(
            p.request_id, p.iteration, p.ts,
            None if resume is None else resume.iteration, None if resume is None else resume.ts,
            round((1.0 - miss) * doubt, 4), tuple(evidence)))
    return result


def preemption_counts(inferred: Sequence[InferredPreemption], samples: Sequence[MetricsSample]) -> PreemptionCounts:
    rise = sum(d for _, _, d in _counter_deltas(samples))
    return PreemptionCounts(len(inferred), rise, sum("counter_rise" in p.evidence for p in inferred))


def _counter_deltas(samples: Sequence[MetricsSample]) -> list[tuple[float, float, float]]:
    """(previous scrape ts, scrape ts, rise) for consecutive scrapes that both saw the counter."""
    out: list[tuple[float, float, float]] = []
    prev: MetricsSample | None = None
    for s in samples:
        if s.preemptions_total is None:
            continue
        if prev is not None and not s.counter_reset:
            out.append((prev.ts, s.ts, max(s.preemptions_total - (prev.preemptions_total or 0.0), 0.0)))
        prev = s
    return out


class _Deltas:
    """`_counter_deltas` with the one whose scrape window holds a moment found by bisection: consecutive scrapes'
    windows follow one another without overlap when the samples came in time order (checked once; else each
    search walks them all, as before)."""

    def __init__(self, samples: Sequence[MetricsSample]) -> None:
        self.deltas = _counter_deltas(samples)
        self._starts = [t0 for t0, _, _ in self.deltas]
        self._ordered = all(t0 <= t1 for t0, t1, _ in self.deltas) \
            and all(a[1] <= b[0] for a, b in pairwise(self.deltas))

    def __len__(self) -> int:
        return len(self.deltas)

    def holding(self, ts: float) -> int | None:
        """The first delta with t0 <= ts < t1 (a sighting: the scrape before its step saw the counter)."""
        if not self._ordered:
            return next((j for j, (t0, t1, _) in enumerate(self.deltas) if t0 <= ts < t1), None)
        j = bisect.bisect_right(self._starts, ts) - 1
        return j if j >= 0 and ts < self.deltas[j][1] else None

    def after(self, ts: float) -> int | None:
        """The first delta with t0 < ts <= t1 (an output: the first scrape after it was processed)."""
        if not self._ordered:
            return next((j for j, (t0, t1, _) in enumerate(self.deltas) if t0 < ts <= t1), None)
        j = bisect.bisect_left(self._starts, ts) - 1
        return j if j >= 0 and ts <= self.deltas[j][1] else None


def _counter_matches(resumes: Sequence[ResumeSighting],
                     watch: _Deltas) -> tuple[set[ResumeSighting], set[ResumeSighting]]:
    """Resumptions the counter's rises account for, and those it was watching but did not count.

    A rise shows at the first scrape after the step's output was processed, or the next one if the step
    landed while that scrape was in flight; each unit of rise confirms one resumption, earliest first.
    """
    budget = [d for _, _, d in watch.deltas]
    confirmed: set[ResumeSighting] = set()
    silent: set[ResumeSighting] = set()
    for r in sorted(resumes, key=lambda r: r.ts):
        i = watch.after(r.ts)
        if i is None:
            continue
        for j in (i, i + 1):
            if j < len(budget) and budget[j] >= 1.0:
                budget[j] -= 1.0
                confirmed.add(r)
                break
        else:
            silent.add(r)
    return confirmed, silent


def _refuted(p: PreemptionSighting, resume: ResumeSighting | None, lc: RequestLifecycle | None,
             watch: _Deltas) -> bool:
    """Whether vLLM's own counter says this sighting was no preemption: the victim produced output after it
    (its resumption, or its span's first token or finish), and `vllm:num_preemptions_total`, watched without a
    break from before the sighting until two scrapes after that output, never rose.

    vLLM counts a preemption when the victim's next output is processed (the PREEMPTED event rides on it), so a
    real one must show by then; only an abort before any further output escapes it, and an aborted request has
    no finish to read. Such a sighting is dropped, not kept at a low confidence: vLLM's own count says the
    inference that made it was wrong about the step's membership, which is what must be fixed, not hedged, and
    /v1/timeline lists every sighting kept (those below the actionable bar too, as doubts)."""
    if not watch:
        return False
    out_ts = resume.ts if resume is not None else None
    if lc is not None and lc.complete and lc.aborted_ts is None:
        later = [t for t in (lc.first_token_ts, lc.finish_ts) if t is not None and t > p.ts]
        out_ts = min([*later, *([] if out_ts is None else [out_ts])], default=out_ts)
    if out_ts is None:
        return False
    i = watch.holding(p.ts)
    if i is None:
        return False
    deltas = watch.deltas
    for j in range(i, len(deltas)):
        t0, t1, rise = deltas[j]
        if rise > 0 or (j > i and t0 != deltas[j - 1][1]):  # it rose, or the watch broke (a reset, a gap)
            return False
        if t0 >= out_ts:  # the scrape after the one that saw the output: two scrapes after it, still flat
            return True
    return False


def _kv_dropped(steps: Sequence[tuple[StepInput, StepOutcome]], k: int, p: PreemptionSighting) -> bool:
    if k == 0 or p.blocks_freed <= 0:
        return False
    before, after = steps[k - 1][1].observed_blocks, steps[k][1].observed_blocks
    if before is None or after is None:
        return False
    return before - after >= 0.5 * p.blocks_freed


class _StepEnds:
    """Counts the steps inside a lifecycle by bisection over their ends when they end in order (the timeline's
    steps end in feed order, never earlier than the one before), not by a walk over every step per sighting."""

    def __init__(self, steps: Sequence[tuple[StepInput, StepOutcome]], in_order: bool = False,
                 end_ms: Sequence[int] | None = None) -> None:
        self.steps = steps
        self.ms: list[int] | None = None
        self.sorted_ms = end_ms  # given in order: bisected as it is, over the first len(steps)
        if not in_order:
            ms = [si.end_ms for si, _ in steps]
            if not all(a <= b for a, b in pairwise(ms)):
                self.ms = ms

    def between(self, lo_ms: int, hi_ms: int) -> int:
        """Steps with lo_ms < end_ms <= hi_ms."""
        if self.ms is not None:
            return sum(1 for m in self.ms if lo_ms < m <= hi_ms)
        if self.sorted_ms is not None:
            n, ms = len(self.steps), self.sorted_ms
            return max(bisect.bisect_right(ms, hi_ms, 0, n) - bisect.bisect_right(ms, lo_ms, 0, n), 0)
        hi = bisect.bisect_right(self.steps, hi_ms, key=_end_ms)
        return max(hi - bisect.bisect_right(self.steps, lo_ms, key=_end_ms), 0)


def _end_ms(step: tuple[StepInput, StepOutcome]) -> int:
    return step[0].end_ms


def _lifecycle_gap(ends: _StepEnds, lc: RequestLifecycle) -> bool:
    """A complete lifecycle spanning more steps than it has tokens to show for: it sat out some of them."""
    if not lc.complete or lc.first_token_ts is None or lc.finish_ts is None or not lc.completion_tokens:
        return False
    spanned = ends.between(fact_ms(lc.first_token_ts), fact_ms(lc.finish_ts))
    return spanned > lc.completion_tokens - 1
