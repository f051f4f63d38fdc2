"""The vLLM /metrics source: the poller, registered under the name dashboards know (`vllm_metrics`)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from attrib_agent.events import Event
from attrib_agent.recording import METRICS
from attrib_agent.sources.metrics.parser import CounterTracker, MetricsParseError
from attrib_agent.sources.metrics.poller import MetricsPoller, observe_body
from attrib_agent.sources.metrics.settings import ROWS
from attrib_agent.sources.source import RecordParse, ReplayContext, SourceContext, SourceSpec, checked_record_parse

if TYPE_CHECKING:
    from attrib_agent.config.load import AgentConfig

NAME = "vllm_metrics"


def build(cfg: AgentConfig, ctx: SourceContext) -> MetricsPoller:
    """Always on: without vLLM's gauges there is no pool size and no restart detection."""
    return MetricsPoller(cfg.metrics_url or "", interval_s=cfg.metrics_interval_s, timeout_s=cfg.metrics_timeout_s,
                         health=ctx.health(NAME), clock=ctx.clock, name=NAME)


def record_parser(ctx: ReplayContext) -> RecordParse:
    """A recorded scrape (`{"ts", "text"}`) through the poller's own parse and restart tracker."""
    tracker = CounterTracker()

    def parse(rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
        return observe_body(str(rec["text"]), ts, ctx.health, tracker)

    return checked_record_parse(parse, ctx.health, bad_input=(MetricsParseError,), bad_record=(KeyError,),
                                count_success=False)


SPEC = SourceSpec(NAME, ROWS, build, stream=METRICS,
                  parser=record_parser)
