"""Sources: the I/O that reads vLLM and the GPU (poll, tail, receive), each beside a pure parser.

Every source emits the frozen events of `attrib_agent.events` and keeps a `SourceHealth`; one folder per
source (log/, metrics/, otlp/, nvml/), each registered in `registry.py`.
"""

from attrib_agent.sources.source import Source, SourceContext, SourceSpec

__all__ = ["Source", "SourceContext", "SourceSpec"]
