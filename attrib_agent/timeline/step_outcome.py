"""What inferring one engine step produces: its record plus the departures, preemptions and resumptions seen.

Kept apart from the inference so that the ledger, the preemption inference and the timeline window can
read outcomes without depending on how they were inferred.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attrib_agent.events import quick_init
from attrib_agent.timeline.kv_share import KvSplit, split_holdings
from attrib_agent.timeline.model import StepRecord
from attrib_agent.timeline.step_counts import Slot


@quick_init
@dataclass(frozen=True, slots=True)
class Departure:
    """A request leaving the scheduler, with what the inference saw of it."""

    request_id: str
    seq: int  # the last step in which it could have held KV
    end_ts: float  # when it left: the end of that step
    reason: str  # "finished" | "aborted" | "restart"
    prompt: int | None
    outputs: int
    admitted_seq: int | None
    first_token_seq: int | None
    preempt_seqs: tuple[int, ...]
    cached: int | None = None  # prompt tokens found in vLLM's prefix cache at admission (None: not seen)


@quick_init
@dataclass(frozen=True, slots=True)
class PreemptionSighting:
    """A running request that left a step without finishing: its KV is dropped and it waits to recompute."""

    request_id: str
    seq: int
    iteration: int
    ts: float  # start of the step in which it was dropped
    kv_pressure: bool  # the block model says this step's allocation did not fit: vLLM's preemption trigger
    tokens_dropped: int
    blocks_freed: int


@quick_init
@dataclass(frozen=True, slots=True)
class ResumeSighting:
    request_id: str
    seq: int
    iteration: int
    ts: float  # end of the step in which it was scheduled again
    recompute_tokens: int


class _SplitMemo:
    """Room for `StepOutcome.kv_split`'s answer: a slot outside the dataclass's fields, so it is neither compared,
    printed nor carried over by `dataclasses.replace` (a replaced outcome has other holdings)."""

    __slots__ = ("_kv_split",)
    _kv_split: KvSplit


@quick_init
@dataclass(frozen=True, slots=True)
class StepOutcome(_SplitMemo):
    record: StepRecord
    departures: tuple[Departure, ...] = ()
    preemptions: tuple[PreemptionSighting, ...] = ()
    resumes: tuple[ResumeSighting, ...] = ()
    holdings: tuple[tuple[str, int], ...] = ()  # (request id, blocks) held after the step by every running request
    predicted_blocks: int | None = None  # their sum (None without geometry)
    observed_blocks: float | None = None  # the line's KV usage x usable blocks
    # (request id, the request whose prefix copy it shares, hit blocks) of every running request with a prefix hit
    prefix_shares: tuple[tuple[str, str, int], ...] = ()

    def kv_split(self) -> KvSplit:
        """The holdings with shared prefix blocks counted once (kv_share.py), worked out on the first read: an
        outcome never changes, and the ledger, the causes' pool and /v1/timeline each read it, every pass."""
        try:
            return self._kv_split
        except AttributeError:
            split = split_holdings(self.holdings, self.prefix_shares)
            object.__setattr__(self, "_kv_split", split)  # past the frozen check; a race stores equal values
            return split


@dataclass(slots=True)
class StepWork:
    """Scratch for one step: what was decided, in scheduling order."""

    slots: list[Slot] = field(default_factory=list)
    departures: list[Departure] = field(default_factory=list)
    preemptions: list[PreemptionSighting] = field(default_factory=list)
    resumes: list[ResumeSighting] = field(default_factory=list)
