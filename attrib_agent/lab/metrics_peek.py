"""The few numbers the lab itself needs from vLLM's /metrics: idle check, pool size, preemptions.

The agent's own metrics source is a separate, complete parser; this is a lab-side glance only.
"""

from __future__ import annotations

from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class MetricsPeek:
    running: float = 0.0
    waiting: float = 0.0
    kv_usage: float = 0.0
    preemptions: float = 0.0
    block_size: int | None = None
    num_gpu_blocks: int | None = None


def peek(text: str) -> MetricsPeek:
    """Sum over engines of the gauges/counters above; cache geometry from `vllm:cache_config_info`."""
    vals = {"running": 0.0, "waiting": 0.0, "kv_usage": 0.0, "preemptions": 0.0}
    block_size = num_blocks = None
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name == "vllm:num_requests_running":
                vals["running"] += s.value
            elif s.name == "vllm:num_requests_waiting":
                vals["waiting"] += s.value
            elif s.name == "vllm:kv_cache_usage_perc":
                vals["kv_usage"] = max(vals["kv_usage"], s.value)
            elif s.name == "vllm:num_preemptions_total":
                vals["preemptions"] += s.value
            elif s.name == "vllm:cache_config_info":
                if s.labels.get("block_size", "").isdigit():
                    block_size = int(s.labels["block_size"])
                if s.labels.get("num_gpu_blocks", "").isdigit():
                    num_blocks = int(s.labels["num_gpu_blocks"])
    return MetricsPeek(block_size=block_size, num_gpu_blocks=num_blocks, **vals)
