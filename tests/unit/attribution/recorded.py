"""Inputs for the simulator from a real recording, built the way the engine will before its timeline exists:
requests from spans, pool geometry from /metrics, the cost model fitted on the logged engine steps with the
per-step features (decode context, prefill attention) estimated from span times."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache
from pathlib import Path

from attrib_agent.attribution.cost_model import StepCostModel, StepFeatures, prefill_pairs
from attrib_agent.attribution.sim_types import SchedulerConfig, SimRequest
from attrib_agent.events import EngineStep, MetricsSnapshot, RequestSpan
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).resolve().parents[2] / "fixtures" / "recordings"


@dataclass(frozen=True)
class Recorded:
    name: str
    spans: tuple[RequestSpan, ...]
    steps: tuple[EngineStep, ...]
    config: SchedulerConfig
    preemptions: int  # rise of vllm:num_preemptions_total across the run

    @property
    def requests(self) -> list[SimRequest]:
        return [SimRequest(s.request_id, s.start_ts, s.prompt_tokens or 1, s.completion_tokens or 1)
                for s in self.spans]

    def span(self, suffix: str) -> RequestSpan:
        return next(s for s in self.spans if s.request_id.endswith(f"-{suffix}-0"))

    @staticmethod
    def spec_id(request_id: str) -> str:
        """`cmpl-<run tag>-<spec id>-0` -> spec id (`w1`, `s004`)."""
        return request_id.split("-")[-2]

    def is_whale(self, request_id: str) -> bool:
        return self.spec_id(request_id).startswith("w")


@cache
def load(name: str) -> Recorded:
    spans: list[RequestSpan] = []
    steps: list[EngineStep] = []
    snaps: list[MetricsSnapshot] = []
    for ev in ReplaySource(RECORDINGS / name).events():
        if isinstance(ev, RequestSpan):
            spans.append(ev)
        elif isinstance(ev, EngineStep) and not ev.dummy:
            steps.append(ev)
        elif isinstance(ev, MetricsSnapshot):
            snaps.append(ev)
    geometry = next(s for s in snaps if s.block_size and s.num_gpu_blocks)
    assert geometry.block_size is not None and geometry.num_gpu_blocks is not None
    budget = max(s.context_tokens + s.generation_tokens for s in steps)  # the largest step shows the budget
    budget = 1 << (budget - 1).bit_length()
    counters = [s.preemptions_total for s in snaps if s.preemptions_total is not None]
    spans.sort(key=lambda s: (s.start_ts, s.request_id))
    return Recorded(name, tuple(spans), tuple(steps),
                    SchedulerConfig(geometry.block_size, geometry.num_gpu_blocks, token_budget=budget),
                    int(max(counters) - min(counters)) if counters else 0)


def step_features(rec: Recorded) -> list[tuple[StepFeatures, float, float | None]]:
    """(features, elapsed_s, gap before it) per logged step, decode contexts and prefill progress from spans."""
    windows = []
    for s in rec.spans:
        assert s.ttft_s is not None and s.e2e_s is not None and s.queue_s is not None
        windows.append((s.start_ts + s.queue_s, s.start_ts + s.ttft_s, s.start_ts + s.e2e_s,
                        s.prompt_tokens or 1, s.completion_tokens or 1))
    done = [0] * len(windows)
    out: list[tuple[StepFeatures, float, float | None]] = []
    prev_end: float | None = None
    for step in rec.steps:
        end = step.log_ts if step.log_ts is not None else step.ts
        start = end - step.elapsed_ms / 1000
        # Spans cannot see a preempted request pause: keep the earliest-admitted `generation_requests` decoders
        # (vLLM preempts the most recently admitted first).
        decoders = sorted((sched, prompt + int((start - first) / max(finish - first, 1e-9) * completion))
                          for sched, first, finish, prompt, completion in windows if first <= start < finish)
        decoders = decoders[:step.generation_requests]
        decode_requests, decode_context = len(decoders), sum(c for _, c in decoders)
        prefill = step.context_tokens + max(step.generation_tokens - step.generation_requests, 0)
        left, pairs = prefill, 0
        for i, (sched, first, _finish, prompt, _c) in enumerate(windows):
            if left > 0 and sched <= end and first >= start and done[i] < prompt:
                take = min(left, prompt - done[i])
                pairs += prefill_pairs(done[i], take)
                done[i] += take
                left -= take
        if left > 0:
            pairs += prefill_pairs(0, left)
        gap = None if prev_end is None else start - prev_end
        prev_end = end
        out.append((StepFeatures(prefill, decode_requests, decode_context, pairs), step.elapsed_ms / 1000, gap))
    return out


@cache
def fitted_cost(rec: Recorded) -> StepCostModel:
    """The default model (lab CPU prior), fed every logged step of the recording (read-only afterwards)."""
    model = StepCostModel()
    for features, elapsed, gap in step_features(rec):
        model.observe_features(features, elapsed, gap_s=gap)
    model.refit()
    return model
