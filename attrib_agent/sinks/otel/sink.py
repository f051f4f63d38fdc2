"""`attrib.slowdown` spans as a sink: each settled batch emitted inside vLLM's traces (live runs only)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting
from attrib_agent.sinks.otel.spans import SlowdownSpans, tracer_provider_for
from attrib_agent.sinks.sink import SinkSpec

if TYPE_CHECKING:
    from attrib_agent.config.load import AgentConfig
    from attrib_agent.read_model import AgentState

NAME = "span"
FLUSH_ON_SHUTDOWN_MS = 5_000
ROWS: Final[tuple[Setting[Any], ...]] = (
    Setting("otlp_export", "otlp", v.otlp_target, None, "send the agent's attrib.slowdown spans here (`none`: off)",
            "URL", default_text="the otlp_forward target, else off"),
)


class SpanSink:
    name = NAME

    def __init__(self, spans: SlowdownSpans, state: AgentState) -> None:
        self.spans = spans
        self._state = state

    def on_results(self, results: Sequence[AttributionResult]) -> None:
        self.spans.emit_all(results, self._state.span_of, self._state)

    def flush(self) -> None:
        """Nothing to do: the BatchSpanProcessor exports on its own schedule."""

    def shutdown(self) -> None:
        self.spans.force_flush(FLUSH_ON_SHUTDOWN_MS)
        self.spans.tracer_provider.shutdown()


def build(cfg: AgentConfig, state: AgentState) -> SpanSink | None:
    target = cfg.otlp_export
    if target is None:
        return None
    return SpanSink(SlowdownSpans(tracer_provider_for(target.endpoint, protocol=target.protocol)), state)


SPEC = SinkSpec(NAME, ROWS, build, in_replay=False)
