"""The few numbers the lab itself needs from vLLM's /metrics: idle check, pool size, preemptions.

A summary over engines of what the agent's own metrics parser reads (one parser per format).
"""

from __future__ import annotations

from dataclasses import dataclass

from attrib_agent.sources.metrics.parser import parse_metrics


@dataclass(frozen=True)
class MetricsPeek:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    preemptions: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None


def peek(text: str) -> MetricsPeek:
    """Sums over engines of the gauges/counters above (KV usage: the fullest engine); cache geometry."""
    snaps = parse_metrics(text, 0.0)
    geometry = next((s for s in snaps if s.block_size is not None), None)
    return MetricsPeek(
        running=sum(s.running or 0.0 for s in snaps),
        waiting=sum(s.waiting or 0.0 for s in snaps),
        kv_usage=max((s.kv_usage or 0.0 for s in snaps), default=0.0),
        preemptions=sum(s.preemptions_total or 0.0 for s in snaps),
        block_size=geometry.block_size if geometry else None,
        num_gpu_blocks=geometry.num_gpu_blocks if geometry else None,
    )
