"""The typed events every source emits: frozen values, stamped with their receipt time.

This is the contract between `sources/` (I/O and parsers) and the pure `timeline/` and `attribution/`
code: live and replay produce exactly these, so everything downstream is driven the same way.
Times are unix seconds (float). `ts` is always when the agent *received* the input; `log_ts` is the
time printed in a vLLM log line (millisecond or second resolution, or None when the line had none).
Only ids, counts and times: no event carries prompt or completion text.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, TypeVar

_T = TypeVar("_T")
_NO_ARG: Any = object()


def quick_init(cls: type[_T]) -> type[_T]:
    """Give a frozen, slotted dataclass an `__init__` that sets its slots through their descriptors.

    The generated one sets each field with `object.__setattr__`, which looks the slot up on the type every time
    (~0.25 us a field, ~3 us for a 12-field event: a tenth of decoding a log line, and the timeline builds a few
    such values per step it infers). Same signature, defaults, values and frozen-ness; only classes without
    `__post_init__`, keyword-only or non-init fields are accepted. Apply it above `@dataclass`.
    """
    fields = dataclasses.fields(cls)  # type: ignore[arg-type]
    params = getattr(cls, "__dataclass_params__", None)
    if params is None or not params.frozen or "__slots__" not in cls.__dict__ or hasattr(cls, "__post_init__") \
            or any(f.kw_only or not f.init for f in fields):
        raise TypeError(f"quick_init: {cls.__name__} is not a plain frozen slotted dataclass")
    ns: dict[str, Any] = {"_NO_ARG": _NO_ARG}
    args, body = [], []
    for i, f in enumerate(fields):
        ns[f"_set{i}"] = getattr(cls, f.name).__set__
        if f.default_factory is not dataclasses.MISSING:
            ns[f"_make{i}"] = f.default_factory
            args.append(f"{f.name}=_NO_ARG")
            body.append(f"    _set{i}(self, _make{i}() if {f.name} is _NO_ARG else {f.name})")
            continue
        if f.default is not dataclasses.MISSING:
            ns[f"_default{i}"] = f.default
            args.append(f"{f.name}=_default{i}")
        else:
            args.append(f.name)
        body.append(f"    _set{i}(self, {f.name})")
    exec(f"def __init__(self, {', '.join(args)}):\n" + "\n".join(body or ["    pass"]), ns)  # noqa: S102
    init = ns["__init__"]
    init.__qualname__ = f"{cls.__qualname__}.__init__"
    init.__doc__ = cls.__init__.__doc__
    cls.__init__ = init  # type: ignore[method-assign]
    return cls


@quick_init
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


@quick_init
@dataclass(frozen=True, slots=True)
class RequestReceived:
    """`Received request <id>: params: SamplingParams(...)` (the frontend accepted it)."""

    ts: float
    log_ts: float | None
    request_id: str
    max_tokens: int | None


@quick_init
@dataclass(frozen=True, slots=True)
class RequestAdded:
    """`Added request <id>-<8 hex>.`: handed to the engine under an internal id."""

    ts: float
    log_ts: float | None
    request_id: str
    internal_id: str


@quick_init
@dataclass(frozen=True, slots=True)
class RequestAborted:
    ts: float
    log_ts: float | None
    request_id: str


@quick_init
@dataclass(frozen=True, slots=True)
class RequestFailed:
    ts: float
    log_ts: float | None
    request_id: str
    reason: str  # exception class or short code only, never request content


@quick_init
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


@quick_init
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


@quick_init
@dataclass(frozen=True, slots=True)
class TokenBudgetLine:
    """vLLM's start-up line `Chunked prefill is enabled with max_num_batched_tokens=N.`: the step's token budget,
    exact before any step fills it. vLLM 0.32 logs it only when the budget was given (`--max-num-batched-tokens`);
    its defaults (2,048, 8,192 on large GPUs) are logged at DEBUG only (docs/sources.md)."""

    ts: float
    log_ts: float | None
    token_budget: int


@quick_init
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


@quick_init
@dataclass(frozen=True, slots=True)
class GpuSample:
    ts: float
    gpu: int
    uuid: str | None
    memory_used_bytes: int | None
    memory_total_bytes: int | None
    memory_util_pct: float | None  # NVML "memory utilisation": % of time memory was read or written
    dram_bw_util_pct: float | None  # GPM DRAM bandwidth utilisation (Hopper and newer)


@quick_init
@dataclass(frozen=True, slots=True)
class ScheduledRequest:
    """One request's part in a step, as vLLM's scheduler decided it (exact mode)."""

    request_id: str  # the frontend's (external) id, as every other event carries
    new_tokens: int  # computed in this step
    done_tokens: int | None  # already in its KV before the step (None: vLLM had already let the request go)
    cached_tokens: int | None  # prompt tokens found in the prefix cache (on the step that admits it)


@quick_init
@dataclass(frozen=True, slots=True)
class QueueHead:
    """The first waiting request after the step, and the first admission check it fails (docs/exact-mode.md)."""

    request_id: str
    reason: str
    tokens: int
    need_blocks: int
    preemptions: int


@quick_init
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


@quick_init
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
    | TokenBudgetLine
    | RequestSpan
    | GpuSample
    | SchedulerStep
    | SchedulerHello
)
