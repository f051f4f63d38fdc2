"""I/O out of the pipeline: the result sinks (journal/, otel/) and the state readers (api/, prometheus/).

A result sink has the `Sink` shape and a `SinkSpec` listed in `registry.py`; the API and the collector read
the `AgentState` (read_model.py) when asked.
"""

from attrib_agent.sinks.sink import MultiSink, Sink, SinkSpec

__all__ = ["MultiSink", "Sink", "SinkSpec"]
