"""The contract of the scheduler re-simulation: what goes in, what comes out, what a step costs.

The attribution engine asks "what would the victim's TTFT and ITL have been without these requests?"
by re-running vLLM's scheduling rules over the reconstructed requests with some removed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True, slots=True)
class SimRequest:
    request_id: str
    arrival_ts: float
    prompt_tokens: int
    output_tokens: int
    # Requests of one group share their first `prefix_tokens` prompt tokens (a system prompt, a document):
    # with prefix caching their full blocks are computed once and shared, as vLLM's prefix cache does.
    prefix_group: str | None = None
    prefix_tokens: int = 0


@dataclass(frozen=True, slots=True)
class SchedulerConfig:
    """vLLM v1 scheduling limits. Block geometry from `vllm:cache_config_info`; the budget is
    `max_num_batched_tokens` (2048 on CPU, 8192 on H100-class GPUs), inferred from the largest step."""

    block_size: int
    num_blocks: int
    token_budget: int = 2048
    max_num_seqs: int = 256
    # vLLM v1's default. A preempted request's freed full blocks stay cached until evicted, so its recompute
    # can be (nearly) free; `vllm:cache_config_info{enable_prefix_caching}` says whether it is on.
    prefix_caching: bool = True
    # vLLM's async scheduling (default on GPUs, off on CPU): step k+1 is scheduled before step k's tokens are
    # back, so arrivals, sampled tokens and freed blocks reach the scheduler one step later.
    async_scheduling: bool = False
    # Prefixes already in vLLM's prefix cache when the run starts, (group, tokens): a system prompt computed
    # before the busy period, which its requests hit (the observer sees the hits, not who computed it first).
    warm_prefixes: tuple[tuple[str, int], ...] = ()


@dataclass(frozen=True, slots=True)
class InProgress:
    """A request already on the engine when a run starts from an observed state: `computed` tokens in KV
    (running) or queued (`running` False: waiting, or preempted and back in the queue), `outputs` sampled."""

    request_id: str
    computed: int
    outputs: int
    running: bool
    blocks: int = 0  # KV blocks it holds (running); 0: as many as `computed` needs
    scheduled_ts: float | None = None
    first_token_ts: float | None = None


@dataclass(frozen=True, slots=True)
class SimStart:
    """The observed engine state a run starts from at `ts` (an engine step's end), instead of an idle engine at
    the first arrival: requests in `state` are on the engine then, in admission then queue order; the others
    arrive after `ts`. A window starting here needs none of the history before it (docs/attribution.md)."""

    ts: float
    state: tuple[InProgress, ...] = ()


class StepCost(Protocol):
    """Seconds one engine step takes, from what it computes (the baseline cost model implements this)."""

    def step_seconds(self, context_tokens: int, decode_requests: int, decode_context_sum: int) -> float: ...


@runtime_checkable
class PrefillAwareStepCost(Protocol):
    """A StepCost that also prices prefill attention: a chunk's cost grows with the context it attends to
    (a 2048-token chunk after 4096 cached tokens costs about twice the first chunk). The simulator uses this
    method when the cost offers it. `prefill_pairs` = sum over prefill chunks of causal query-key pairs,
    tokens * prior_context + tokens * (tokens + 1) / 2; `prefill_requests` = how many requests prefill in the
    step (each costs beyond its tokens: its row of logits and sampling), 0 when the caller prices decodes only."""

    def step_seconds_with_prefill(
        self, context_tokens: int, decode_requests: int, decode_context_sum: int, prefill_pairs: int,
        prefill_requests: int = 0,
    ) -> float: ...


@dataclass(frozen=True, slots=True)
class WaitCause:
    """Why the victim did not progress (or progressed slowly) in one simulated step, and for how long."""

    # "kv_pressure" | "head_of_line" | "prefill_contention" | "decode_batching" | "kv_bandwidth" | "preemption"
    cause: str
    seconds: float
    # How much of those seconds each other request accounts for (sums to `seconds`); e.g. KV blocks held for
    # kv_pressure, the blocking request for head_of_line, marginal step cost for contention.
    by_request: tuple[tuple[str, float], ...]
    # Start of the (first) step it covers; entries never span the victim's first token, so those with
    # ts < first_token_ts are TTFT waits and the rest ITL waits. Consecutive alike steps are merged.
    ts: float | None = None


@dataclass(frozen=True, slots=True)
class SimOutcome:
    request_id: str
    scheduled_ts: float | None
    first_token_ts: float | None
    finish_ts: float | None
    token_ts: tuple[float, ...]
    preemptions: int
    waits: tuple[WaitCause, ...] = ()  # filled when the simulation is asked to trace a victim
    queued_ts: float | None = None  # first step boundary at/after arrival: when vLLM's QUEUED event would be

    def ttft_s(self, arrival_ts: float) -> float | None:
        return None if self.first_token_ts is None else self.first_token_ts - arrival_ts

    @property
    def mean_itl_s(self) -> float | None:
        if len(self.token_ts) < 2:
            return None
        return (self.token_ts[-1] - self.token_ts[0]) / (len(self.token_ts) - 1)


@dataclass(frozen=True, slots=True)
class SimResult:
    outcomes: dict[str, SimOutcome]
    steps: int
    preemptions: int
    peak_kv_blocks: int = 0  # most KV blocks held by requests at once
    peak_step_tokens: int = 0  # most tokens scheduled in one step
