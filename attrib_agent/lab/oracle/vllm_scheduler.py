"""vLLM's own v1 scheduler (0.32: `Scheduler` / `AsyncScheduler` with its `KVCacheManager`), driven over a
workload without a model, as vLLM's tests do (`tests/v1/core/utils.py`): a `VllmConfig` over a config.json
only (no weights, no tokenizer), a KV cache of N blocks, and fake model outputs each step (one sampled token
for every request whose prompt is done). The clock advances by the same cost model the re-simulation uses.

With async scheduling the engine keeps two steps in flight (`EngineCore.step_with_batch_queue`): step k+1 is
scheduled before step k's output is processed, so frees and arrivals reach the scheduler one step later.
vLLM's CPU platform turns async scheduling off for a real server; the scheduler class itself runs anywhere.
"""

from __future__ import annotations

import json
import logging
import tempfile
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from attrib_agent.attribution.sim_trace import Member, Pricer
from attrib_agent.attribution.sim_types import StepCost
from attrib_agent.lab.model import MODEL_CONFIG
from attrib_agent.lab.oracle.steps import RunTrace, StepView
from attrib_agent.lab.oracle.workload import OracleRequest, Workload

_EMPTY = StepView((), (), (), ())
MAX_MODEL_LEN = 8192  # the lab model's max_position_embeddings; workloads stay below it
_SAMPLED_TOKEN = 7  # any id but EOS (ignore_eos is set anyway)


@lru_cache(maxsize=1)
def _model_config() -> Any:
    """Built once per process: it reads config.json through transformers, the slow part of a scheduler."""
    from vllm.config import ModelConfig

    path = Path(tempfile.mkdtemp(prefix="attrib-oracle-model-"))
    (path / "config.json").write_text(json.dumps(MODEL_CONFIG))
    return ModelConfig(model=str(path), dtype="float32", seed=0, skip_tokenizer_init=True,
                       max_model_len=MAX_MODEL_LEN)


def build_scheduler(workload: Workload) -> Any:
    """A fresh vLLM scheduler with the workload's limits and pool."""
    import torch
    from vllm.config import CacheConfig, SchedulerConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    cfg = workload.config
    if workload.max_model_len > MAX_MODEL_LEN:
        raise ValueError(f"{workload.name}: a request of {workload.max_model_len} tokens exceeds {MAX_MODEL_LEN}")
    sched_config = SchedulerConfig(
        max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.token_budget, max_model_len=MAX_MODEL_LEN,
        enable_chunked_prefill=True, async_scheduling=workload.async_scheduling, is_encoder_decoder=False)
    cache_config = CacheConfig(block_size=cfg.block_size, enable_prefix_caching=cfg.prefix_caching)
    vllm_config = VllmConfig(scheduler_config=sched_config, model_config=_model_config(), cache_config=cache_config)
    spec = FullAttentionSpec(block_size=cfg.block_size, num_kv_heads=1, head_size=1, dtype=torch.float32)
    kv_config = KVCacheConfig(num_blocks=cfg.num_blocks, kv_cache_tensors=[],
                              kv_cache_groups=[KVCacheGroupSpec(["layer"], spec)])
    cache_config.num_gpu_blocks = cfg.num_blocks
    logging.getLogger("vllm").setLevel(logging.ERROR)  # its per-scheduler warnings about CPU block sizes
    cls = AsyncScheduler if workload.async_scheduling else Scheduler
    return cls(vllm_config=vllm_config, kv_cache_config=kv_config, block_size=cfg.block_size, log_stats=False,
               structured_output_manager=StructuredOutputManager(vllm_config))


def _prompt_ids(r: OracleRequest, index: int) -> list[int]:
    """Shared-prefix groups get the same leading ids; everything else is unique to the request."""
    shared = [10 + (r.prefix_group or 0)] * r.prefix_tokens if r.prefix_group is not None else []
    return shared + [1000 + index] * (r.prompt_tokens - len(shared))


def _make_request(r: OracleRequest, index: int, block_size: int) -> Any:
    from vllm.sampling_params import SamplingParams
    from vllm.utils.hashing import sha256
    from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
    from vllm.v1.request import Request

    init_none_hash(sha256)
    params = SamplingParams(max_tokens=max(r.output_tokens, 1), ignore_eos=True)
    return Request(request_id=r.request_id, prompt_token_ids=_prompt_ids(r, index), sampling_params=params,
                   pooling_params=None, block_hasher=get_request_block_hasher(block_size, sha256))


@dataclass(slots=True)
class _InFlight:
    output: Any
    sampling: list[str]  # requests that sample a token at the end of this step
    index: int
    end: float
    start: float


@dataclass(slots=True)
class StepDone:
    """One model step whose output vLLM's scheduler has processed: what it scheduled, when it ran, and which
    requests it finished (the stepper's `on_step` hook gets these, in order)."""

    output: Any  # vLLM's SchedulerOutput
    index: int
    start: float
    end: float
    sampling: list[str]
    finished: list[str]


class VllmStepper:
    """vLLM's scheduler advanced step by step on the cost model's clock, with requests submitted as they arrive
    (in arrival order): `advance(t)` runs every iteration that begins before t, so a caller can submit the
    arrivals at t after seeing the state then. Submitting everything and `advance()` is `run_vllm`."""

    def __init__(self, workload: Workload, cost: StepCost, *, max_steps: int = 20_000, views: bool = True,
                 on_step: Callable[[StepDone], None] | None = None) -> None:
        self.sched = build_scheduler(workload)
        self._pricer = Pricer(cost)
        self._depth = 2 if workload.async_scheduling else 1
        self._block_size = workload.config.block_size
        self._max_steps, self._views, self._on_step = max_steps, views, on_step
        self.by_id: dict[str, Any] = {}
        self.pending: deque[OracleRequest] = deque()
        self.inflight: deque[_InFlight] = deque()
        self.trace = RunTrace()
        self.now: float | None = None
        self._model_free = 0.0
        self._idle_rounds = 0
        self.stopped = False  # the step limit was hit, or vLLM spun with nothing runnable

    def submit(self, r: OracleRequest, index: int | None = None) -> None:
        """Queue a request arriving at `r.arrival_ts`; `index` makes its prompt ids unique (default: the count
        so far)."""
        if self.pending and r.arrival_ts < self.pending[-1].arrival_ts:
            raise ValueError(f"{r.request_id} arrives before the request submitted last")
        self.by_id[r.request_id] = _make_request(r, len(self.by_id) if index is None else index,
                                                self._block_size)
        self.pending.append(r)
        if self.now is None:
            self.now = self._model_free = r.arrival_ts

    def advance(self, until: float | None = None) -> None:
        """Run iterations while the scheduling moment is before `until` (None: until nothing is left to do)."""
        from vllm.v1.outputs import ModelRunnerOutput

        sched, by_id, pending, inflight, trace = self.sched, self.by_id, self.pending, self.inflight, self.trace
        while self.now is not None and not self.stopped and (until is None or self.now < until):
            if len(trace.steps) >= self._max_steps:
                self.stopped = True
                break
            now = self.now
            while pending and pending[0].arrival_ts <= now:
                sched.add_request(by_id[pending.popleft().request_id])
            scheduled = False
            if sched.has_requests():
                before = {r.request_id for r in sched.running}
                out = sched.schedule()
                if out.total_num_scheduled_tokens > 0:
                    scheduled = True
                    start = max(now, self._model_free)
                    self._model_free = start + self._pricer.seconds(_members(out, by_id))
                    inflight.append(_InFlight(out, [rid for rid in out.num_scheduled_tokens
                                                    if not by_id[rid].is_prefill_chunk], len(trace.steps),
                                              self._model_free, start))
                    trace.steps.append(_view(sched, out, before, start) if self._views else _EMPTY)
            if inflight and (len(inflight) >= self._depth or not scheduled):
                done = inflight.popleft()
                rids = list(done.output.num_scheduled_tokens)
                sampled = [[_SAMPLED_TOKEN] if rid in done.sampling else [] for rid in rids]
                outputs = sched.update_from_output(done.output, ModelRunnerOutput(
                    req_ids=rids, req_id_to_index={rid: i for i, rid in enumerate(rids)},
                    sampled_token_ids=sampled))
                for rid in done.sampling:
                    if rid not in trace.first_token_step and by_id[rid].num_output_tokens > 0:
                        trace.first_token_step[rid], trace.first_token_ts[rid] = done.index, done.end
                self.now = max(now, done.end)
                self._idle_rounds = 0
                if self._on_step is not None:
                    finished = [o.request_id for eco in outputs.values() for o in eco.outputs
                                if o.finish_reason is not None]
                    self._on_step(StepDone(done.output, done.index, done.start, done.end, done.sampling,
                                           finished))
            elif not scheduled:
                if sched.has_requests():  # nothing runnable and nothing in flight: vLLM would spin
                    self._idle_rounds += 1
                    if self._idle_rounds > len(by_id) + 1:
                        self.stopped = True
                    continue
                if not pending:
                    break
                self.now = max(now, pending[0].arrival_ts)

    @property
    def busy(self) -> bool:
        return bool(self.pending) or self.sched.has_requests() or bool(self.inflight)


def run_vllm(workload: Workload, cost: StepCost, *, max_steps: int = 20_000, views: bool = True) -> RunTrace:
    """Run vLLM's scheduler over the workload; one StepView per step that scheduled tokens (with `views`
    False, empty ones: what a simulator would pay without the comparison)."""
    stepper = VllmStepper(workload, cost, max_steps=max_steps, views=views)
    for i, r in sorted(enumerate(workload.requests), key=lambda ir: ir[1].arrival_ts):
        stepper.submit(r, i)
    stepper.advance()
    stepper.trace.truncated = stepper.busy
    return stepper.trace


def _members(out: Any, by_id: dict[str, Any]) -> list[Member]:
    """The step as the cost model sees it (after scheduling, num_computed_tokens already includes it)."""
    members = []
    for rid, n in out.num_scheduled_tokens.items():
        req = by_id[rid]
        prior = req.num_computed_tokens - n
        members.append(Member(rid, n, prior, n == 1 and prior >= req.num_prompt_tokens))
    return members


def _view(sched: Any, out: Any, before: set[str], start: float) -> StepView:
    running = [r.request_id for r in sched.running]
    return StepView(
        scheduled=tuple(sorted(out.num_scheduled_tokens.items())),
        admitted=tuple(sorted(set(running) - before)),
        preempted=tuple(sorted(out.preempted_req_ids)),
        blocks=tuple(sorted((rid, len(sched.kv_cache_manager.get_block_ids(rid)[0])) for rid in running)),
        start_ts=start)
