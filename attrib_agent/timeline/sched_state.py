"""The scheduler state the step inference carries from one engine step to the next.

It mirrors what vLLM's scheduler holds (running list in admission order, waiting queue with preempted requests
at the front, tokens computed per request) as far as an outside observer can reconstruct it. Copies of it
are the checkpoints the timeline rewinds to when a late span corrects an earlier guess.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

MS_PER_S = 1000.0


def end_ms(end_ts: float) -> int:
    """A step's end as integer milliseconds (log stamps are millisecond-truncated)."""
    return round(end_ts * MS_PER_S)


def fact_ms(ts: float) -> int:
    """A vLLM time (span offset) in the same milliseconds: it belongs to the first step whose end_ms >= this."""
    return math.floor(ts * MS_PER_S)


def blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size) if tokens > 0 else 0


@dataclass(frozen=True, slots=True)
class Geometry:
    """KV pool geometry from `vllm:cache_config_info`; usable blocks exclude vLLM's reserved null block."""

    block_size: int | None = None
    num_blocks: int | None = None

    @property
    def usable_blocks(self) -> int | None:
        return None if self.num_blocks is None else max(self.num_blocks - 1, 1)

    @property
    def known(self) -> bool:
        return self.block_size is not None and self.num_blocks is not None


@dataclass(frozen=True, slots=True)
class StepInput:
    """One `Iteration` line, normalised: `seq` is its feed position (iteration numbers restart with vLLM).

    Its start, integer-millisecond end and scheduled tokens are derived once, at construction: the inference
    reads them for every request of every step it (re-)infers."""

    seq: int
    engine: int
    iteration: int
    end_ts: float
    elapsed_s: float
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    kv_usage: float
    start_ts: float = field(init=False, repr=False, compare=False)
    end_ms: int = field(init=False, repr=False, compare=False)
    scheduled_tokens: int = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        _set = object.__setattr__
        _set(self, "start_ts", self.end_ts - self.elapsed_s)
        _set(self, "end_ms", end_ms(self.end_ts))
        _set(self, "scheduled_tokens", self.context_tokens + self.generation_tokens)


@dataclass(slots=True, eq=False)
class Track:
    """One request as the scheduler holds it (compared by identity: it is the scheduler's own object)."""

    rid: str
    queue_ts: float
    order: int
    prompt: int | None = None  # prompt tokens: from the span, or inferred when its prefill completed
    computed: int = 0  # tokens whose KV it holds (vLLM's num_computed_tokens, prefix hits included)
    outputs: int = 0  # tokens generated so far
    prefilled: int = 0  # context tokens computed in prefill chunks (infers an unknown prompt)
    cached: int | None = None  # prompt tokens vLLM's prefix cache gave it (skipped prefill); None until seen
    prefix_root: str | None = None  # with a hit: the request whose copy of the prefix it shares (itself: none)
    admitted_seq: int | None = None
    first_token_seq: int | None = None
    resuming: bool = False  # preempted: its KV is gone and its next scheduling recomputes it
    held_before_preempt: int = 0  # tokens it held when last preempted (their blocks may still be cached)
    preempt_seqs: tuple[int, ...] = ()
    resume_seqs: tuple[int, ...] = ()

    @property
    def num_tokens(self) -> int | None:
        return None if self.prompt is None else self.prompt + self.outputs

    @property
    def phase(self) -> str:
        """How vLLM's iteration line counts it: no output yet is context, else generation."""
        if self.outputs == 0:
            return "prefill"
        return "recompute" if self.resuming else "decode"

    def blocks(self, block_size: int) -> int:
        return blocks_for(self.computed, block_size)

    def clone(self) -> Track:
        """A copy (a checkpoint's): every field, positionally (dataclasses.replace re-reads the field list)."""
        return Track(self.rid, self.queue_ts, self.order, self.prompt, self.computed, self.outputs, self.prefilled,
                     self.cached, self.prefix_root, self.admitted_seq, self.first_token_seq, self.resuming,
                     self.held_before_preempt, self.preempt_seqs, self.resume_seqs)

    def key(self) -> tuple[object, ...]:
        """Every field, the prompt fourth (SchedState.same_as may leave it out)."""
        return (self.rid, self.queue_ts, self.order, self.prompt, self.computed, self.outputs, self.prefilled,
                self.cached, self.admitted_seq, self.first_token_seq, self.resuming, self.held_before_preempt,
                self.preempt_seqs, self.resume_seqs, self.prefix_root)


@dataclass(slots=True)
class SchedState:
    running: list[Track] = field(default_factory=list)
    waiting: list[Track] = field(default_factory=list)
    cursor: tuple[float, int] | None = None  # (queue_ts, order) of the last request taken into the queue
    last_end_ms: int | None = None
    last_iteration: int | None = None
    observed_used: float | None = None  # blocks in use after the previous step, from its logged KV usage
    budget: int = 0  # the token budget so far: the configured one, or the largest step seen

    def copy(self) -> SchedState:
        return SchedState(
            running=[t.clone() for t in self.running],
            waiting=[t.clone() for t in self.waiting],
            cursor=self.cursor,
            last_end_ms=self.last_end_ms,
            last_iteration=self.last_iteration,
            observed_used=self.observed_used,
            budget=self.budget,
        )

    def same_as(self, other: SchedState, span_prompt: Callable[[str], bool] | None = None) -> bool:
        """Equal in everything the next steps' inference reads: re-inference can stop where it converges.
        `span_prompt(rid)`: the request's prompt is copied in from its span before the next step reads it
        (steps._span_prompt), so the one held does not count."""
        if not (self.cursor == other.cursor and self.last_end_ms == other.last_end_ms
                and self.last_iteration == other.last_iteration and self.observed_used == other.observed_used
                and self.budget == other.budget
                and len(self.running) == len(other.running) and len(self.waiting) == len(other.waiting)):
            return False
        for mine, theirs in ((self.running, other.running), (self.waiting, other.waiting)):
            for a, b in zip(mine, theirs, strict=True):
                ka, kb = a.key(), b.key()
                if ka != kb and (span_prompt is None or ka[:3] != kb[:3] or ka[4:] != kb[4:]
                                 or not span_prompt(a.rid)):
                    return False
        return True

    def tracked(self) -> dict[str, Track]:
        return {t.rid: t for t in (*self.running, *self.waiting)}

