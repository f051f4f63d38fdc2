"""The vLLM /metrics series attrib-agent reads, as data: kind, unit, vLLM's help text and old names.

vLLM renames series between releases (deprecated in X.Y, hidden in X.Y+1, removed in X.Y+2), so the
names live here, not in the parser: supporting another vLLM version is a table edit. `kind` and `help`
are what vLLM 0.32 prints in `# TYPE` / `# HELP` (tests check the table against a real 0.32 body).

Names are as exposed: a counter is listed by its `_total` sample (prometheus_client names the family
without the suffix, the sample with it); a histogram by its base name, whose `_count` and `_sum`
samples are read (`vllm:iteration_tokens_total` is a histogram despite its name).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Final, Literal

Kind = Literal["gauge", "counter", "histogram"]


@dataclass(frozen=True, slots=True)
class Alias:
    """An older name of a series; `why` says which vLLM version renamed it and why."""

    name: str
    why: str


@dataclass(frozen=True, slots=True)
class VllmMetric:
    name: str
    kind: Kind
    unit: str
    help: str
    aliases: tuple[Alias, ...] = ()


# Deprecated in vLLM 0.9.2 (PR #18354), hidden from 0.11 (`--show-hidden-metrics-for-version=0.10`),
# removed in 0.12: the `gpu_` prefix was wrong once the KV cache could live off the GPU (CPU builds, offload).
_GPU_PREFIX_WHY: Final = (
    "vLLM <= 0.11 name; renamed in 0.9.2 (dropping the misleading gpu_ prefix: the KV cache is not always "
    "on a GPU), hidden from 0.11, removed in 0.12"
)

_TABLE: Final = (
    VllmMetric("vllm:num_requests_running", "gauge", "requests", "Number of requests in model execution batches."),
    VllmMetric("vllm:num_requests_waiting", "gauge", "requests", "Number of requests waiting to be processed."),
    VllmMetric(
        "vllm:kv_cache_usage_perc", "gauge", "ratio", "KV-cache usage. 1 means 100 percent usage.",
        # Same value (a 0..1 fraction of KV blocks in use) under its pre-0.9.2 name.
        aliases=(Alias("vllm:gpu_cache_usage_perc", _GPU_PREFIX_WHY),),
    ),
    VllmMetric(
        "vllm:num_preemptions_total", "counter", "preemptions", "Cumulative number of preemption from the engine."
    ),
    VllmMetric("vllm:prompt_tokens_total", "counter", "tokens", "Number of prefill tokens processed."),
    VllmMetric("vllm:generation_tokens_total", "counter", "tokens", "Number of generation tokens processed."),
    VllmMetric(
        "vllm:iteration_tokens_total", "histogram", "tokens", "Histogram of number of tokens per engine_step."
    ),
    VllmMetric(
        "vllm:prefix_cache_queries_total", "counter", "tokens",
        "Prefix cache queries, in terms of number of queried tokens.",
        # Same counter under its pre-0.9.2 name. (V0's `vllm:gpu_prefix_cache_hit_rate` is a rate, not an alias.)
        aliases=(Alias("vllm:gpu_prefix_cache_queries_total", _GPU_PREFIX_WHY),),
    ),
    VllmMetric(
        "vllm:prefix_cache_hits_total", "counter", "tokens",
        "Prefix cache hits, in terms of number of cached tokens.",
        aliases=(Alias("vllm:gpu_prefix_cache_hits_total", _GPU_PREFIX_WHY),),
    ),
    # An info-style gauge fixed at 1: its labels are every CacheConfig field (block_size, num_gpu_blocks ...).
    VllmMetric("vllm:cache_config_info", "gauge", "info", "Information of the LLMEngine CacheConfig"),
)

METRICS: Final[Mapping[str, VllmMetric]] = MappingProxyType({m.name: m for m in _TABLE})
"""Canonical (vLLM 0.32) name -> its description."""

_HISTOGRAM_SUFFIXES: Final = ("_count", "_sum")


def sample_names(metric: VllmMetric, name: str | None = None) -> tuple[str, ...]:
    """The sample names a series (or one of its aliases, `name`) appears under in a /metrics body."""
    base = metric.name if name is None else name
    if metric.kind == "histogram":
        return tuple(base + s for s in _HISTOGRAM_SUFFIXES)
    return (base,)


def _build_index() -> Mapping[str, tuple[VllmMetric, str, bool]]:
    index: dict[str, tuple[VllmMetric, str, bool]] = {}
    for m in _TABLE:
        for name, is_alias in ((m.name, False), *((a.name, True) for a in m.aliases)):
            for sample in sample_names(m, name):
                index[sample] = (m, sample[len(name):], is_alias)
    return MappingProxyType(index)


_SAMPLE_INDEX: Final = _build_index()


def resolve_sample(sample_name: str) -> tuple[VllmMetric, str, bool] | None:
    """(metric, suffix, is_alias) for a sample name we read, e.g. `..._count` -> (histogram, "_count", False).

    None for every series attrib-agent does not read.
    """
    return _SAMPLE_INDEX.get(sample_name)
