"""The typed events every source emits: frozen values, stamped with their receipt time.

This is the contract between `sources/` (I/O and parsers) and the pure `timeline/` and `attribution/`
code: live and replay produce exactly these, so everything downstream is driven the same way.
Times are unix seconds (float). `ts` is always when the agent *received* the input; `log_ts` is the
time printed in a vLLM log line (millisecond or second resolution, or None when the line had none).
Only ids, counts and times: no event carries prompt or completion text.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class MetricsSnapshot:
    """One engine's view from one /metrics scrape (one per `engine`/`model_name` label pair)."""

    ts: float
    engine: str
    model_name: str
    running: float | None
    waiting: float | None
    kv_usage: float | None  # 0..1
    preemptions_total: float | None
    prompt_tokens_total: float | None
    generation_tokens_total: float | None
    iteration_tokens_count: float | None  # `vllm:iteration_tokens_total` histogram: steps observed
    iteration_tokens_sum: float | None  # ... and tokens processed in them
    prefix_cache_queries_total: float | None
    prefix_cache_hits_total: float | None
    block_size: int | None  # from vllm:cache_config_info
    num_gpu_blocks: int | None
    counter_reset: bool = False  # a counter went backwards since the previous scrape: vLLM restarted


@dataclass(frozen=True, slots=True)
class RequestReceived:
    """`Received request <id>: params: SamplingParams(...)` (the frontend accepted it)."""

    ts: float
    log_ts: float | None
    request_id: str
    max_tokens: int | None


@dataclass(frozen=True, slots=True)
class RequestAdded:
    """`Added request <id>-<8 hex>.`: handed to the engine under an internal id."""

    ts: float
    log_ts: float | None
    request_id: str
    internal_id: str


@dataclass(frozen=True, slots=True)
class RequestAborted:
    ts: float
    log_ts: float | None
    request_id: str


@dataclass(frozen=True, slots=True)
class RequestFailed:
    ts: float
    log_ts: float | None
    request_id: str
    reason: str  # exception class or short code only, never request content


@dataclass(frozen=True, slots=True)
class EngineStep:
    """One `Engine NNN: Iteration(i): ...` line: what one engine step did."""

    ts: float
    log_ts: float | None
    engine: int
    iteration: int
    context_requests: int
    context_tokens: int
    generation_requests: int
    generation_tokens: int
    elapsed_ms: float
    kv_usage: float  # 0..1
    device: str  # "GPU" or "CPU" as vLLM prints it
    dummy: bool = False


@dataclass(frozen=True, slots=True)
class StatsLine:
    """The periodic `Engine NNN: Avg prompt throughput ...` line; optional parts are None when absent."""

    ts: float
    log_ts: float | None
    engine: int
    prompt_throughput: float
    generation_throughput: float
    running: int | None
    waiting: int | None
    kv_usage: float | None  # 0..1
    prefix_cache_hit_rate: float | None  # 0..1
    preemptions: int | None


@dataclass(frozen=True, slots=True)
class RequestSpan:
    """vLLM's per-request `llm_request` span, as received over OTLP."""

    ts: float
    request_id: str
    trace_id: str  # 32 hex
    span_id: str  # 16 hex
    start_ts: float  # = arrival
    end_ts: float
    queue_s: float | None
    ttft_s: float | None
    e2e_s: float | None
    prefill_s: float | None
    decode_s: float | None
    inference_s: float | None
    prompt_tokens: int | None
    completion_tokens: int | None
    max_tokens: int | None


@dataclass(frozen=True, slots=True)
class GpuSample:
    ts: float
    gpu: int
    uuid: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    memory_util_pct: float | None  # NVML "memory utilisation": % of time memory was read or written
    dram_bw_util_pct: float | None  # GPM DRAM bandwidth utilisation (Hopper and newer)


@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request's part in a step, as vLLM's scheduler decided it (exact mode)."""

    request_id: str  # the frontend's (external) id, as every other event carries
    new_tokens: int  # computed in this step
    done_tokens: int | None  # already in its KV before the step (None: vLLM had already let the request go)
    cached_tokens: int | None  # prompt tokens found in the prefix cache (on the step that admits it)


@dataclass(frozen=True, slots=True)
class QueueHead:
    """The first waiting request after the step, and the first admission check it fails (docs/exact-mode.md)."""

    request_id: str
    reason: str
    tokens: int
    need_blocks: int
    preemptions: int


@dataclass(frozen=True, slots=True)
class SchedulerStep:
    """One `Scheduler.schedule()` call reported by the step plugin inside vLLM (exact mode)."""

    ts: float
    sched_ts: float  # the engine core's clock when the step was scheduled
    engine: int
    step: int
    iteration: int | None  # the `Iteration(N)` index of the step; None for a step that scheduled nothing
    tokens: int
    scheduled: tuple[ScheduledRequest, ...]
    admitted: tuple[str, ...]
    resumed: tuple[str, ...]
    preempted: tuple[str, ...]
    finished: tuple[str, ...]
    running: int
    waiting: int
    blocks: tuple[tuple[str, int], ...]  # (request id, KV blocks in its block table after the step)
    free_blocks: int | None
    total_blocks: int | None
    head: QueueHead | None
    drops: int  # messages the plugin has dropped so far


@dataclass(frozen=True, slots=True)
class SchedulerHello:
    """The step plugin's first message per scheduler: the pool's geometry as vLLM configured it."""

    ts: float
    engine: int
    block_size: int
    total_blocks: int
    max_num_seqs: int | None
    token_budget: int | None


Event = (
    MetricsSnapshot
    | RequestReceived
    | RequestAdded
    | RequestAborted
    | RequestFailed
    | EngineStep
    | StatsLine
    | RequestSpan
    | GpuSample
    | SchedulerStep
    | SchedulerHello
)
