"""The `attrib.slowdown` spans: one per attributed victim, inside the victim's trace, linked to its culprits.

`spans.py` builds the spans (tested against an in-memory exporter), `export.py` the agent's tracer provider
and OTLP exporter, `sink.py` the result sink that ties them to the agent.
"""

from attrib_agent.sinks.otel.export import tracer_provider_for
from attrib_agent.sinks.otel.sink import SpanSink
from attrib_agent.sinks.otel.spans import SPAN_NAME, SlowdownSpans

__all__ = ["SPAN_NAME", "SlowdownSpans", "SpanSink", "tracer_provider_for"]
