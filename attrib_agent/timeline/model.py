"""Values the timeline reconstructs from events: request lifecycles and engine steps with their members.

Pure data. `timeline/` builds them from `attrib_agent.events`; `attribution/` reads them. All times are
unix seconds; a field is None while the evidence for it has not arrived (live, a request is known from
its log lines long before its span lands).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from attrib_agent.events import quick_init


@quick_init
@dataclass(frozen=True, slots=True)
class RequestLifecycle:
    """What is known of one request (id as vLLM reports it: `cmpl-<X-Request-Id>-0`, `chatcmpl-...`)."""

    request_id: str
    engine: int = 0
    arrival_ts: float | None = None  # span start, else the `Received request` log time
    scheduled_ts: float | None = None  # arrival + time_in_queue (first scheduled)
    first_token_ts: float | None = None  # arrival + TTFT
    finish_ts: float | None = None  # arrival + e2e
    aborted_ts: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None  # known when the span lands
    max_tokens: int | None = None  # from `Received request` (an upper bound before the span lands)
    prefill_s: float | None = None
    decode_s: float | None = None
    complete: bool = False  # the span has landed: the times above are vLLM's own

    @property
    def ttft_s(self) -> float | None:
        if self.arrival_ts is None or self.first_token_ts is None:
            return None
        return self.first_token_ts - self.arrival_ts

    @property
    def queue_s(self) -> float | None:
        if self.arrival_ts is None or self.scheduled_ts is None:
            return None
        return self.scheduled_ts - self.arrival_ts

    @property
    def mean_itl_s(self) -> float | None:
        """vLLM's definition: decode time over the gaps between output tokens."""
        if self.decode_s is None or not self.completion_tokens or self.completion_tokens < 2:
            return None
        return self.decode_s / (self.completion_tokens - 1)

    @property
    def end_ts(self) -> float | None:
        return self.finish_ts if self.finish_ts is not None else self.aborted_ts


@quick_init
@dataclass(frozen=True, slots=True)
class StepMember:
    """One request's part in one engine step."""

    request_id: str
    phase: str  # "prefill", "decode", or "recompute" (a preempted request rebuilding its KV; logged as generation)
    tokens: int  # prompt tokens computed (prefill), 1 (decode), or tokens recomputed (recompute)
    context_tokens: int  # tokens in its KV after this step
    blocks: int  # KV blocks it holds after this step


@quick_init
@dataclass(frozen=True, slots=True)
class StepRecord:
    """One engine step (`Iteration(i)` line) with the members the timeline inferred for it."""

    engine: int
    iteration: int
    end_ts: float  # log time of the line (ms precision), else receipt time
    elapsed_s: float
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    kv_usage: float  # 0..1, as vLLM printed it
    members: tuple[StepMember, ...] = field(default_factory=tuple)
    membership_error: int = 0  # |inferred - logged| over the four counts: 0 means the members explain the line

    @property
    def start_ts(self) -> float:
        return self.end_ts - self.elapsed_s

    @property
    def decode_context_sum(self) -> int:
        return sum(m.context_tokens for m in self.members if m.phase == "decode")
