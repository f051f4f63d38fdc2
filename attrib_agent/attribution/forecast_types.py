"""What a forecast starts from: the engine's state now, the candidates, the load expected meanwhile."""

from __future__ import annotations

from dataclasses import dataclass

from attrib_agent.attribution.sim_types import SchedulerConfig


@dataclass(frozen=True, slots=True)
class Candidate:
    """A request that could be admitted now; `cached_prefix_tokens` of its prompt are in the prefix cache."""

    prompt_tokens: int
    max_tokens: int
    cached_prefix_tokens: int = 0

    def __post_init__(self) -> None:
        if self.prompt_tokens < 1 or self.max_tokens < 1:
            raise ValueError("prompt_tokens and max_tokens must be >= 1")
        if not 0 <= self.cached_prefix_tokens <= self.prompt_tokens:
            raise ValueError("cached_prefix_tokens must be between 0 and prompt_tokens")


@dataclass(frozen=True, slots=True)
class InFlight:
    """A request on the engine now: running (KV holds `computed` tokens) or waiting (computed 0)."""

    request_id: str
    arrival_ts: float
    prompt_tokens: int
    computed: int
    outputs: int  # tokens generated so far
    remaining: int  # output tokens still to come (max_tokens - outputs, or an estimate)
    running: bool
    first_token_ts: float | None = None


@dataclass(frozen=True, slots=True)
class ArrivalLoad:
    """Requests expected to arrive: evenly spaced at `rate_per_s`, each of this size; the first `first_in_s`
    from now (None: half a gap, the mean wait to the next arrival when its phase is unknown). A mixed stream
    gives its sizes as `mix`, (prompt, max_tokens) pairs taken in turn (a stream a third of whose prompts are
    1,024 tokens is not a stream of its median 32-token one); `cached_prefix_tokens` of each prompt are shared
    by the stream (a system prompt, a document): computed once by the first, then found in vLLM's prefix cache."""

    rate_per_s: float
    prompt_tokens: int
    max_tokens: int
    first_in_s: float | None = None
    mix: tuple[tuple[int, int], ...] = ()
    cached_prefix_tokens: int = 0

    def size(self, i: int) -> tuple[int, int]:
        """The i-th expected arrival's (prompt, max_tokens)."""
        return self.mix[i % len(self.mix)] if self.mix else (self.prompt_tokens, self.max_tokens)

    def __post_init__(self) -> None:
        if not self.rate_per_s >= 0 or self.prompt_tokens < 1 or self.max_tokens < 1:
            raise ValueError("load needs rate_per_s >= 0, prompt_tokens >= 1 and max_tokens >= 1")
        if self.first_in_s is not None and not self.first_in_s >= 0:
            raise ValueError("first_in_s must be >= 0")
        if any(p < 1 or m < 1 for p, m in self.mix) or self.cached_prefix_tokens < 0:
            raise ValueError("load mix sizes must be >= 1 and cached_prefix_tokens >= 0")


@dataclass(frozen=True, slots=True)
class EngineState:
    now: float
    sched: SchedulerConfig
    requests: tuple[InFlight, ...]  # running ones in admission order, then waiting ones in queue order
    load: ArrivalLoad | None = None
    ttft_offset_s: float = 0.0  # the frontend's own part of TTFT (outside engine steps), learnt by attribution
    engine: int = 0  # the vLLM engine (data-parallel rank) it is the state of
    load_basis: str = "declared"  # where `load` came from: declared (the caller's), learnt, saved (the last
    # agent's); with no load the forecast runs a probe arrival instead (forecast.expected_arrivals)
