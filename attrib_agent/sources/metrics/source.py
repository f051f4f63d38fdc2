"""The vLLM /metrics source: the poller, registered under the name dashboards know (`vllm_metrics`)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from attrib_agent.recording import METRICS
from attrib_agent.sources.metrics.poller import MetricsPoller
from attrib_agent.sources.metrics.settings import ROWS
from attrib_agent.sources.source import SourceContext, SourceSpec

if TYPE_CHECKING:
    from attrib_agent.config.load import AgentConfig

NAME = "vllm_metrics"


def build(cfg: AgentConfig, ctx: SourceContext) -> MetricsPoller:
    """Always on: without vLLM's gauges there is no pool size and no restart detection."""
    return MetricsPoller(cfg.metrics_url or "", interval_s=cfg.metrics_interval_s, timeout_s=cfg.metrics_timeout_s,
                         health=ctx.health(NAME), clock=ctx.clock, name=NAME)


SPEC = SourceSpec(NAME, ROWS, build, stream=METRICS)
