"""What the running agent knows, in one place the sinks read: the pipeline's answers, each source's health,
vLLM's gaps, and whether the agent is ready (with the reasons it is not).

The agent owns it and mutates it from one asyncio loop; sinks (collector, API, page, spans) only read, and
only through these methods, never through the pipeline's parts; so no locks, and the pipeline can change
inside without touching a sink.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar

from attrib_agent import __version__
from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.attribution.culprit_windows import TopCulprits
from attrib_agent.attribution.forecast import ArrivalLoad, Candidate, EngineState, Forecast, ForecastSettings
from attrib_agent.attribution.forecast_cache import ForecastCache
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.tally import SlowdownTally
from attrib_agent.events import GpuSample
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline, KvNow, PipelineStats
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.timeline.preemption import InferredPreemption
from attrib_agent.timeline.sched_state import StepInput
from attrib_agent.timeline.step_outcome import StepOutcome

REFERENCE_MAX_AGE_S = 2.0
"""Event time the reference whale's gauge may lag the state (the agent refreshes it every SINK_FLUSH_S)."""
OPTIONAL_SOURCES = frozenset({"nvml", "otlp_forward"})  # down or absent, attribution still works: never unready
SOURCES = ("vllm_metrics", "vllm_log", "otlp", "otlp_forward", "nvml", "replay", "pipeline", "journal")


T = TypeVar("T")


async def inline(read: Callable[[], Any]) -> Any:
    """Run a read on the caller's loop: where the pipeline lives when nothing else feeds it (a replay, tests)."""
    return read()


@dataclass(frozen=True)
class Backlog:
    """How far the pipeline is behind the stream, and what it sheds to keep up (`/readyz`, the pipeline series)."""

    events: int  # received, not yet fed to the pipeline
    oldest_s: float  # how long the oldest of them has waited (0 when none)
    attributed_share: float  # of the requests that finish, the share attributed now (1: all; less while shedding)
    victims_skipped: int  # requests not attributed because the agent shed load, since start
    budget_cores: float | None  # the agent's CPU budget (None: no shedding, e.g. a replay)
    cores: float  # the pipeline thread's CPU lately
    slowed_attributed: int = 0  # of the requests the share left out, final results attributed as visibly slowed
    slowed_skipped: int = 0  # ... and visibly slowed ones skipped past the bounds on those (in victims_skipped)

    @property
    def shedding(self) -> bool:
        return self.attributed_share < 1.0


@dataclass(frozen=True)
class Readiness:
    """Ready or not, and why not: `/readyz` and the health series read this one decision."""

    ready: bool
    reasons: tuple[str, ...]  # empty when ready


@dataclass
class AgentState:
    pipeline: AttributionPipeline
    health: dict[str, SourceHealth] = field(default_factory=dict)  # by source name (SOURCES)
    clock: Callable[[], float] = time.time
    started_ts: float = field(default_factory=time.time)
    version: str = __version__
    journal_written: int = 0
    journal_errors: Counter[str] = field(default_factory=Counter)
    vllm_gaps: int = 0  # times vLLM went unreachable or restarted while the agent ran
    vllm_gap_since: float | None = None  # set while vLLM is unreachable now
    replay_done: bool = True  # False while a replay is still feeding events (readyz waits for it)
    forecast_settings: ForecastSettings = field(default_factory=ForecastSettings)  # the forecast's SLOs, whale
    forecasts: ForecastCache = field(default_factory=ForecastCache)  # the forecast's state, once per settle
    _reference: tuple[int, float, int, float] | None = field(default=None, init=False, repr=False)  # the gauge's
    # (settles, event ts, engine, harm)
    # Where reads of the pipeline run: the thread that feeds it (the live agent's pipeline thread, agent/core.py),
    # so a read never sees the pipeline halfway through an event and the event loop never waits for a rebuild.
    reads: Callable[[Callable[[], Any]], Awaitable[Any]] = field(default=inline, repr=False)
    backlog: Callable[[], Backlog] | None = field(default=None, repr=False)  # the agent's queue, when it has one
    mode_now: str | None = None  # `mode()` as of the pipeline thread's last batch (probes read it on the loop)

    async def read(self, fn: Callable[[], T]) -> T:
        """`fn()` run where the pipeline lives (a worker thread live, inline otherwise); awaited, never blocking."""
        out: T = await self.reads(fn)
        return out

    def pipeline_backlog(self) -> Backlog:
        """The agent's backlog (nothing queued and nothing shed without an agent around the pipeline)."""
        if self.backlog is not None:
            return self.backlog()
        p = self.pipeline
        return Backlog(0, 0.0, p.attribute_share, p.victims_skipped, None, 0.0, p.slowed_attributed, p.slowed_skipped)

    def source(self, name: str) -> SourceHealth:
        """The health record of a source, created on first use."""
        if name not in self.health:
            self.health[name] = SourceHealth(name)
        return self.health[name]

    def adopt(self, health: SourceHealth) -> None:
        """A source that keeps its own health record reports it under its name."""
        self.health[health.name] = health

    def vllm_gap_seconds(self) -> float:
        """How long the gap open now has lasted (0 when none; never negative, even if the clock stepped back)."""
        since = self.vllm_gap_since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    def readiness(self) -> Readiness:
        """Required sources up and the step-cost model fitted (or a replay finished). NVML (no GPU, no driver)
        and the forwarder (the user's collector down) only degrade what is reported, so they never unready."""
        down = [f"source {name} down" + (f" ({h.last_error})" if h.last_error else "")
                for name, h in sorted(self.health.items()) if not h.up and name not in OPTIONAL_SOURCES]
        fitted = self.cost_model.fitted
        if not down and (fitted or self.replay_done and not self.live):
            return Readiness(True, ())  # a replay still running does not unready a fitted model
        reasons = down + ["replay still running"] * (not self.replay_done)
        if not fitted and (self.live or not self.replay_done):
            reasons.append("step-cost model not fitted yet (it needs quiet engine steps)")
        return Readiness(False, tuple(reasons))

    @property
    def ready(self) -> bool:
        return self.readiness().ready

    @property
    def live(self) -> bool:
        return "replay" not in self.health

    # ---- the pipeline's answers --------------------------------------------------------------------------
    def result(self, request_id: str) -> AttributionResult | None:
        return self.pipeline.store.get(request_id)

    def status(self, request_id: str) -> str:
        return self.pipeline.status(request_id)

    def client_id(self, request_id: str) -> str:
        """The request the agent reports `request_id` under (an n>1 child's client request, else itself)."""
        return self.pipeline.client_id(request_id)

    def settled_status(self, request_id: str) -> str | None:
        """`status()` when stored, waiting or skipped (None otherwise): no timeline read, safe from the loop."""
        return self.pipeline.settled_status(request_id)

    def top_culprits(self, window_s: float, limit: int) -> tuple[float | None, float | None, TopCulprits]:
        """(since, until, culprits) over the last `window_s` of event time (the agent's clock live, the
        recording's end in replay), read from the store's culprit index."""
        until = self.pipeline.last_event_ts
        if until is None:
            return None, None, TopCulprits([], 0, 0)
        return until - window_s, until, self.pipeline.store.culprits.top(until - window_s, until, limit)

    def kv_now(self) -> KvNow:
        return self.pipeline.kv_now()

    def mode(self) -> str:
        """`exact` while vLLM's step plugin reports the steps (docs/exact-mode.md), else `inferred`."""
        return self.mode_now if self.mode_now is not None else self.pipeline.mode()

    def stats(self) -> PipelineStats:
        return self.pipeline.stats()

    def span_of(self, request_id: str) -> tuple[str, str] | None:
        return self.pipeline.span_of(request_id)

    def lifecycle(self, request_id: str) -> RequestLifecycle | None:
        return self.pipeline.lifecycle(request_id)

    def lifecycles(self) -> list[RequestLifecycle]:
        return self.pipeline.lifecycles()

    def preemptions(self) -> list[InferredPreemption]:
        return self.pipeline.preemptions()

    def actionable_preemptions(self) -> list[InferredPreemption]:
        return self.pipeline.actionable_preemptions()

    def outcomes(self) -> list[tuple[StepInput, StepOutcome]]:
        return self.pipeline.outcomes()

    def pool(self) -> tuple[int | None, int | None]:
        return self.pipeline.pool()

    def token_budget(self) -> int:
        return self.pipeline.token_budget()

    def token_budget_source(self) -> str:
        return self.pipeline.token_budget_source()

    def forecast(self, candidates: Sequence[Candidate], load: ArrivalLoad | None = None,
                 prompts: Mapping[str, int] | None = None) -> tuple[EngineState, list[Forecast]] | None:
        """The admission forecast of `candidates` from the engine's state as of the first forecast since the last
        settle (None before any event): the gauge and repeated requests read it from the cache."""
        return self.forecasts.forecast(self.pipeline, self.pipeline.settles, candidates,
                                       self.forecast_settings.config, load, prompts)

    def reference_harm(self, max_age_s: float = REFERENCE_MAX_AGE_S) -> tuple[int, float] | None:
        """(engine, summed extra TTFT) of the reference whale admitted now, for the gauge: the value computed at
        most `max_age_s` of event time ago (or at the current settle), else computed now. The agent refreshes
        it off the scrape path (`refresh_reference`), so a scrape reads a number instead of re-simulating."""
        ref, now = self._reference, self.pipeline.last_event_ts
        if ref is not None and now is not None and (ref[0] == self.pipeline.settles or now - ref[1] < max_age_s):
            return ref[2], ref[3]
        return self.refresh_reference()

    def refresh_reference(self) -> tuple[int, float] | None:
        """Compute the reference whale's forecast from the state now (once per settle: a no-op when no settle
        ran since the last one) and keep it for the gauge."""
        settles, now = self.pipeline.settles, self.pipeline.last_event_ts
        if self._reference is not None and self._reference[0] == settles:
            return self._reference[2], self._reference[3]
        answer = self.forecast([self.forecast_settings.reference])
        if answer is None or now is None:
            return None
        state, [f] = answer
        self._reference = (settles, now, state.engine, f.ttft_extra_sum_s)
        return state.engine, f.ttft_extra_sum_s

    def gpu_samples(self, since: float | None = None) -> list[GpuSample]:
        return self.pipeline.gpu_samples(since)

    @property
    def victim_threshold_s(self) -> float:
        return self.pipeline.victim_threshold_s

    @property
    def cost_model(self) -> StepCostModel:
        return self.pipeline.cost_model

    @property
    def tally(self) -> SlowdownTally:
        return self.pipeline.tally

    @property
    def last_event_ts(self) -> float | None:
        return self.pipeline.last_event_ts


class TimelineReads(Protocol):
    """What the timeline view reads: the pipeline answers it, and so does the agent's state."""

    @property
    def last_event_ts(self) -> float | None: ...

    @property
    def victim_threshold_s(self) -> float: ...

    def status(self, request_id: str) -> str: ...

    def result(self, request_id: str) -> AttributionResult | None: ...

    def kv_now(self) -> KvNow: ...

    def lifecycles(self) -> list[RequestLifecycle]: ...

    def preemptions(self) -> list[InferredPreemption]: ...

    def outcomes(self) -> list[tuple[StepInput, StepOutcome]]: ...

    def pool(self) -> tuple[int | None, int | None]: ...

    def token_budget(self) -> int: ...

    def token_budget_source(self) -> str: ...

    def gpu_samples(self, since: float | None = None) -> list[GpuSample]: ...
