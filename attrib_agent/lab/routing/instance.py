"""One serving instance of the routing study: vLLM's own scheduler stepped on the lab's cost model, the typed
events that vLLM would have produced for it, and (optionally) an attrib-agent fed those events behind its real API.

The events are what the live sources parse from vLLM: `Received request` / `Added request` log lines at the
arrival, one `Iteration(N)` line per model step (context and generation counts computed by vLLM's own
`compute_iteration_details`, the step's priced duration, KV usage after scheduling), a `/metrics` scrape every
`SCRAPE_S` and the request's `llm_request` span `SPAN_DELAY_S` after it finished. The agent only sees the events
stamped at or before the moment it is asked.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from attrib_agent.attribution.sim_types import StepCost
from attrib_agent.events import EngineStep, Event, MetricsSnapshot, RequestAdded, RequestReceived, RequestSpan
from attrib_agent.lab.oracle.vllm_scheduler import StepDone, VllmStepper
from attrib_agent.lab.oracle.workload import OracleRequest, Workload
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig

SCRAPE_S = 1.0  # the agent's /metrics scrape interval
SPAN_DELAY_S = 1.0  # an OTLP span reaches the agent this long after the request finished (batch export)
BASE_TS = 1_800_000_000.0  # event clock origin: study time 0 is this unix time


@dataclass(slots=True)
class Served:
    """One request's life on an instance, in study time (seconds from 0)."""

    request_id: str
    arrival: float
    prompt_tokens: int
    max_tokens: int
    scheduled: float | None = None  # start of the first step that computed any of it
    first_token: float | None = None
    finished: float | None = None
    output_tokens: int = 0

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.arrival


class Instance:
    """vLLM's scheduler + the events it implies (+ an agent reading them, when `agent` is set)."""

    def __init__(self, workload: Workload, cost: StepCost, *, agent: bool,
                 on_request: Callable[[httpx.Request], Any] | None = None) -> None:
        cfg = workload.config
        self.config = cfg
        self.stepper = VllmStepper(workload, cost, max_steps=1_000_000, views=False, on_step=self._on_step)
        self.served: dict[str, Served] = {}
        self._events: list[tuple[float, int, Event]] = []  # heap by (ts, sequence)
        self._seq = 0
        self._iteration = 0
        self.preemptions = 0
        self._next_scrape = 0.0
        self.pipeline: AttributionPipeline | None = None
        self.client: httpx.AsyncClient | None = None
        if agent:
            from attrib_agent.read_model import AgentState
            from attrib_agent.sinks.api.app import api_app

            self.pipeline = AttributionPipeline(PipelineConfig(token_budget=cfg.token_budget))
            state = AgentState(self.pipeline, clock=self._agent_clock)
            hooks = {"request": [on_request]} if on_request is not None else {}
            self.client = httpx.AsyncClient(transport=httpx.ASGITransport(app=api_app(state)),
                                            base_url="http://agent", event_hooks=hooks)

    def _agent_clock(self) -> float:
        last = self.pipeline.last_event_ts if self.pipeline is not None else None
        return last if last is not None else BASE_TS

    # ---- the world -------------------------------------------------------------------------------------
    def submit(self, r: OracleRequest) -> None:
        """The request arrives now (its `arrival_ts`): vLLM's frontend logs it and hands it to the engine."""
        self.stepper.submit(r)
        self.served[r.request_id] = Served(r.request_id, r.arrival_ts, r.prompt_tokens, r.output_tokens)
        ts = BASE_TS + r.arrival_ts
        self._emit(RequestReceived(ts, round(ts, 3), r.request_id, r.output_tokens))
        self._emit(RequestAdded(ts, round(ts, 3), r.request_id, f"{r.request_id}-{self._seq:08x}"))

    def advance(self, until: float | None) -> None:
        self.stepper.advance(until)
        if self.stepper.stopped:
            raise RuntimeError(f"vLLM's scheduler stopped (step limit or spinning) at t={self.stepper.now}")

    @property
    def load(self) -> int:
        """Requests running or waiting (arrived, not yet scheduled): what a least-loaded balancer reads."""
        s = self.stepper
        return len(s.sched.running) + len(s.sched.waiting) + len(s.pending)

    def _on_step(self, done: StepDone) -> None:
        from vllm.v1.utils import compute_iteration_details

        sched = self.stepper.sched
        for rid in done.output.num_scheduled_tokens:
            sv = self.served[rid]
            if sv.scheduled is None:
                sv.scheduled = done.start
        for rid in done.sampling:
            sv = self.served[rid]
            sv.output_tokens += 1
            if sv.first_token is None:
                sv.first_token = done.end
        self.preemptions += len(done.output.preempted_req_ids)
        for rid in done.finished:
            self.served[rid].finished = done.end
        if self.pipeline is None:
            return
        d = compute_iteration_details(done.output)
        ts = BASE_TS + done.end
        self._emit(EngineStep(ts, round(ts, 3), 0, self._iteration, d.num_ctx_requests, d.num_ctx_tokens,
                              d.num_generation_requests, d.num_generation_tokens,
                              round((done.end - done.start) * 1000, 2), round(sched.kv_cache_manager.usage, 3),
                              "CPU"))
        self._iteration += 1
        for rid in done.finished:
            self._emit(_span(self.served[rid], self._seq))
        while self._next_scrape <= done.end:
            self._emit(MetricsSnapshot(
                BASE_TS + done.end, "0", "tiny", float(len(sched.running)), float(len(sched.waiting)),
                sched.kv_cache_manager.usage, float(self.preemptions), None, None, None, None, None, None,
                self.config.block_size, self.config.num_blocks))
            self._next_scrape += SCRAPE_S

    def _emit(self, ev: Event) -> None:
        if self.pipeline is None:
            return  # nobody reads them (the policies without an agent)
        heapq.heappush(self._events, (ev.ts, self._seq, ev))
        self._seq += 1

    # ---- the agent -------------------------------------------------------------------------------------
    def feed_agent(self, until: float) -> int:
        """Give the agent every event stamped at or before study time `until`; returns how many."""
        n = 0
        limit = BASE_TS + until
        while self._events and self._events[0][0] <= limit:
            ev = heapq.heappop(self._events)[2]
            if self.pipeline is not None:
                self.pipeline.feed(ev)
            n += 1
        return n

    async def close(self) -> None:
        if self.client is not None:
            await self.client.aclose()


def _span(sv: Served, n: int) -> RequestSpan:
    assert sv.finished is not None and sv.scheduled is not None and sv.first_token is not None
    start, end = BASE_TS + sv.arrival, BASE_TS + sv.finished
    return RequestSpan(
        end + SPAN_DELAY_S, sv.request_id, f"{n:032x}", f"{n:016x}", start, end,
        queue_s=sv.scheduled - sv.arrival, ttft_s=sv.first_token - sv.arrival, e2e_s=sv.finished - sv.arrival,
        prefill_s=sv.first_token - sv.scheduled, decode_s=sv.finished - sv.first_token,
        inference_s=sv.finished - sv.scheduled, prompt_tokens=sv.prompt_tokens, completion_tokens=sv.output_tokens,
        max_tokens=sv.max_tokens)
