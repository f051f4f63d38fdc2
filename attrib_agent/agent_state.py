"""What the running agent knows, in one place the sinks read: the pipeline, each source's health, the clock.

The app owns it and mutates it from one asyncio loop; sinks (collector, API, page) only read, so no locks.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from attrib_agent import __version__
from attrib_agent.attribution.forecast import ForecastSettings
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.health import SourceHealth

OPTIONAL_SOURCES = frozenset({"nvml", "otlp_forward"})  # down or absent, attribution still works: never unready
SOURCES = ("vllm_metrics", "vllm_log", "otlp", "otlp_forward", "nvml", "replay", "pipeline", "journal")


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
    forecast: ForecastSettings = field(default_factory=ForecastSettings)  # the forecast endpoint's and gauge's

    def source(self, name: str) -> SourceHealth:
        """The health record of a source, created on first use."""
        if name not in self.health:
            self.health[name] = SourceHealth(name)
        return self.health[name]

    def vllm_gap_seconds(self) -> float:
        """How long the gap open now has lasted (0 when none; never negative, even if the clock stepped back)."""
        since = self.vllm_gap_since
        return 0.0 if since is None else max(0.0, self.clock() - since)

    @property
    def ready(self) -> bool:
        """Required sources up and the step-cost model fitted (or a replay finished). NVML (no GPU, no driver)
        and the forwarder (the user's collector down) only degrade what is reported, so they never unready."""
        sources_up = all(h.up for name, h in self.health.items() if name not in OPTIONAL_SOURCES)
        return sources_up and (self.pipeline.attributor.cost.fitted or self.replay_done and not self.live)

    @property
    def live(self) -> bool:
        return "replay" not in self.health
