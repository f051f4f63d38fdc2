"""vLLM's `/metrics`: a poller (I/O) and a parser that keeps the series named in `vllm_names.py`."""

from attrib_agent.sources.metrics.parser import CounterTracker, MetricsParseError, parse_metrics
from attrib_agent.sources.metrics.poller import MetricsPoller
from attrib_agent.sources.metrics.source import SPEC

__all__ = ["SPEC", "CounterTracker", "MetricsParseError", "MetricsPoller", "parse_metrics"]
