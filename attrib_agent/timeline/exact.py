"""Exact mode: the step plugin's facts laid over the inferred steps (docs/exact-mode.md).

vLLM's scheduler reports each step's members, tokens, blocks per request and preemptions; where a logged
step (`Iteration(N)`) has its plugin step, those facts replace what the inference guessed for it. The
inference still runs underneath (departures, first tokens, steps the plugin missed) and is the whole answer
where the plugin is absent, so a timeline without plugin steps gives exactly what it gave before.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import NamedTuple

from attrib_agent.events import SchedulerHello, SchedulerStep
from attrib_agent.timeline.kv_share import Holdings, Shares, split_holdings
from attrib_agent.timeline.model import StepMember
from attrib_agent.timeline.preemption import InferredPreemption
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import PreemptionSighting, ResumeSighting, StepOutcome

PLUGIN_EVIDENCE = "plugin"  # the evidence of a preemption vLLM itself reported
Outcomes = list[tuple[StepInput, StepOutcome]]


class ExactSteps:
    """The plugin's steps held by `Iteration` index, bounded like the timeline's own steps.

    The index restarts with vLLM (the pipeline starts a fresh timeline then); an index going backwards here
    drops what was held. Steps that scheduled nothing have no index and nothing to lay over, but the requests they
    list as finished finished after the last indexed step (vLLM schedules once more after its last busy step).
    """

    def __init__(self, max_steps: int = 50_000, max_requests: int = 10_000) -> None:
        self._steps: OrderedDict[int, SchedulerStep] = OrderedDict()
        self._preempted: OrderedDict[str, None] = OrderedDict()  # ever preempted: its recompute is no prefill
        self._cached: OrderedDict[str, int] = OrderedDict()  # prompt tokens found in the prefix cache
        self._gone: dict[int, set[str]] = {}  # by iteration: requests that finished at its end (freed their blocks)
        self._max_steps, self._max_requests = max_steps, max_requests
        self.hello: SchedulerHello | None = None
        self.unindexed = 0  # steps without an Iteration index (nothing scheduled)
        # by iteration: the last overlay of each step the last `overlay` call was given, with what it read
        # (bounded by those steps: each call keeps only its own)
        self._overlaid: dict[int, _Overlaid] = {}

    def __len__(self) -> int:
        return len(self._steps)

    def add(self, ev: SchedulerStep | SchedulerHello) -> None:
        if isinstance(ev, SchedulerHello):
            self.hello = ev
            return
        last = next(reversed(self._steps), None)
        if ev.finished and last is not None:  # `finished`: since the previous schedule(), so after the last step
            gone = self._gone.setdefault(last, set())
            gone.update(ev.finished[:max(self._max_requests - len(gone), 0)])
        if ev.iteration is None:
            self.unindexed += 1
            return
        if last is not None and ev.iteration < last:
            self._steps.clear()
            self._gone.clear()
        self._steps[ev.iteration] = ev
        while len(self._steps) > self._max_steps:
            self._gone.pop(self._steps.popitem(last=False)[0], None)
        for rid in ev.preempted:
            _put(self._preempted, rid, None, self._max_requests)
        for s in ev.scheduled:
            if s.cached_tokens is not None:
                _put(self._cached, s.request_id, s.cached_tokens, self._max_requests)

    def get(self, iteration: int) -> SchedulerStep | None:
        return self._steps.get(iteration)

    def cached_tokens(self, request_id: str) -> int | None:
        return self._cached.get(request_id)

    def overlay(self, outcomes: Outcomes, prompt_of: Callable[[str], int | None],
                block_size: int | None = None) -> Outcomes:
        """Every held step, with the plugin's facts in place of the inferred ones where it has them. `block_size`:
        the pool's (from vLLM's metrics) when the plugin's hello was not seen: prefix hits are counted in blocks.

        A step's plugin facts (members, preemptions, resumes, holdings) are rebuilt only when something they read
        changed since the last call (its plugin step or the one before, a member's prompt or preemption, a holder's
        prefix hit, what finished at its end, the block size), and laid over its inferred outcome again only when
        that changed too (a re-inference): a pass reads every step held, and between two passes most of them change
        in none of these."""
        bs = self.hello.block_size if self.hello is not None else block_size
        out: Outcomes = []
        kept: dict[int, _Overlaid] = {}
        was = self._overlaid
        prev: SchedulerStep | None = None
        for si, o in outcomes:
            step = self._steps.get(si.iteration)
            if step is None:
                out.append((si, o))
            else:
                before = prev if prev is not None and prev.iteration == si.iteration - 1 else \
                    self._steps.get(si.iteration - 1)
                gone = self._gone.get(si.iteration)
                prompts = tuple([prompt_of(s.request_id) for s in step.scheduled])
                preempted = tuple([s.request_id in self._preempted for s in step.scheduled])
                reads = (prompts, preempted, tuple([self._cached.get(rid) for rid, _ in step.blocks]), bs,
                         len(gone) if gone else 0)
                last = was.get(si.iteration)
                if last is None or not (last.si is si and last.step is step and last.before is before
                                        and last.reads == reads):
                    last = _Overlaid(si, step, before, reads, o,
                                     self._exact_outcome(si, o, step, before, prompts, preempted, bs))
                elif last.inferred is not o:  # re-inferred: the same facts, laid over its new outcome
                    x = last.outcome
                    last = last._replace(inferred=o, outcome=self._lay(o, x.record.members, x.record.membership_error,
                                                                       x.preemptions, x.resumes, x.holdings, bs))
                kept[si.iteration] = last
                out.append((si, last.outcome))
            prev = step
        self._overlaid = kept
        return out

    def _exact_outcome(self, si: StepInput, o: StepOutcome, step: SchedulerStep, before: SchedulerStep | None,
                       prompts: tuple[int | None, ...], preempted: tuple[bool, ...], bs: int | None) -> StepOutcome:
        """The inferred outcome with the plugin's facts of the step in place of its guesses: members (their
        `prompts` and whether vLLM ever `preempted` them give their phase), preemptions, resumes, holdings."""
        blocks = dict(step.blocks)
        members = tuple(StepMember(s.request_id, _phase(s.new_tokens, s.done_tokens, prompt, was_preempted),
                                   s.new_tokens, (s.done_tokens or 0) + s.new_tokens, blocks.get(s.request_id, 0))
                        for s, prompt, was_preempted in zip(step.scheduled, prompts, preempted, strict=True))
        logged_reqs = si.context_requests + si.generation_requests
        logged_tokens = si.context_tokens + si.generation_tokens
        error = abs(len(members) - logged_reqs) + abs(sum(m.tokens for m in members) - logged_tokens)
        had = dict(before.blocks) if before is not None else {}
        done = {s.request_id: (s.done_tokens or 0) + s.new_tokens for s in before.scheduled} if before else {}
        preemptions = tuple(PreemptionSighting(rid, si.seq, si.iteration, si.start_ts, True, done.get(rid, 0),
                                               had.get(rid, 0)) for rid in step.preempted)
        new = {s.request_id: s.new_tokens for s in step.scheduled}
        resumes = tuple(ResumeSighting(rid, si.seq, si.iteration, si.end_ts, new.get(rid, 0)) for rid in step.resumed)
        gone = self._gone.get(si.iteration)  # finished in this step: freed before vLLM reports KV usage
        holdings = tuple([h for h in step.blocks if h[0] not in gone]) if gone else step.blocks
        return self._lay(o, members, error, preemptions, resumes, holdings, bs)

    def _lay(self, o: StepOutcome, members: tuple[StepMember, ...], error: int,
             preemptions: tuple[PreemptionSighting, ...], resumes: tuple[ResumeSighting, ...],
             holdings: tuple[tuple[str, int], ...], bs: int | None) -> StepOutcome:
        """`o` with the plugin's facts in place of its guesses (the prefix shares follow the holdings)."""
        shares = self._shares(holdings, o.prefix_shares, bs)
        return replace(o, record=replace(o.record, members=members, membership_error=error), preemptions=preemptions,
                       resumes=resumes, holdings=holdings, predicted_blocks=split_holdings(holdings, shares).total,
                       prefix_shares=shares)

    def _shares(self, holdings: Holdings, inferred: Shares, bs: int | None) -> tuple[tuple[str, str, int], ...]:
        """`StepOutcome.prefix_shares` of the plugin's holdings: each holder's prefix-cache hit in whole blocks as
        vLLM reported it, shared with the request the inference chose for it (steps.py `_shared_copies`: whose
        copy fits the pool's usage), or with none running when the inference saw no hit."""
        if not bs or not self._cached:
            return ()
        roots = {rid: root for rid, root, _ in inferred}
        return tuple([(rid, roots.get(rid, rid), hit // bs) for rid, _ in holdings
                      if (hit := self._cached.get(rid)) is not None and hit >= bs])


# What a step's overlay reads besides its inferred outcome and plugin steps, and may change while it is held: of
# each member (in the plugin's order) its prompt and whether vLLM ever preempted it, each holder's prefix-cache hit,
# the block size, and how many requests finished at its end (that set only grows while the step is held). A plain
# tuple: it is built for every step held at every pass.
_Reads = tuple[tuple[int | None, ...], tuple[bool, ...], tuple[int | None, ...], int | None, int]


class _Overlaid(NamedTuple):
    """A step's overlay and what it was built from (the objects themselves: they are immutable)."""

    si: StepInput
    step: SchedulerStep
    before: SchedulerStep | None
    reads: _Reads
    inferred: StepOutcome
    outcome: StepOutcome


def _phase(new: int, done: int | None, prompt: int | None, preempted: bool) -> str:
    """A member's phase from the plugin's token counts and its prompt: a recompute when vLLM ever preempted it."""
    done = done or 0
    if (prompt is not None and done >= prompt) or (prompt is None and new == 1 and done > 0):
        return "decode"
    return "recompute" if preempted else "prefill"


def exact_iterations(outcomes: Outcomes, exact: ExactSteps) -> set[int]:
    return {si.iteration for si, _ in outcomes if exact.get(si.iteration) is not None}


def certain(preemptions: Sequence[InferredPreemption], exact_iters: set[int]) -> list[InferredPreemption]:
    """Preemptions vLLM reported are named with certainty; those of steps it did not report stay inferred."""
    return [replace(p, confidence=1.0, evidence=(PLUGIN_EVIDENCE,)) if p.preempted_iteration in exact_iters else p
            for p in preemptions]


def _put(d: OrderedDict[str, object] | OrderedDict[str, int] | OrderedDict[str, None], key: str, value: object,
         cap: int) -> None:
    d[key] = value  # type: ignore[assignment]
    d.move_to_end(key)
    while len(d) > cap:
        d.popitem(last=False)
