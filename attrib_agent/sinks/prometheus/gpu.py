"""The GPU's own series (NVML, per GPU index): memory used and total, and the DRAM bandwidth in use.

Each GPU's latest reading the timeline holds; no GPU (or NVML off) is families with no sample. vLLM reserves
its KV up front, so memory used stays flat while serving: bandwidth is what moves with the KV decodes read.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from attrib_agent.events import GpuSample
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.families import gauge
from attrib_agent.timeline.gpu_samples import bandwidth_ratio


def gpu_families(state: AgentState) -> list[Metric]:
    latest: dict[int, GpuSample] = {}
    for s in state.gpu_samples():
        latest[s.gpu] = s
    used = gauge("attrib_gpu_memory_used_bytes")
    total = gauge("attrib_gpu_memory_total_bytes")
    bandwidth = gauge("attrib_gpu_dram_bandwidth_ratio")
    for gpu, s in sorted(latest.items()):
        if s.memory_used_bytes is not None:
            used.add_metric([str(gpu)], s.memory_used_bytes)
        if s.memory_total_bytes is not None:
            total.add_metric([str(gpu)], s.memory_total_bytes)
        ratio = bandwidth_ratio(s)
        if ratio is not None:
            bandwidth.add_metric([str(gpu)], ratio)
    return [used, total, bandwidth]
