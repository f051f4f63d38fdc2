"""The agent's /metrics: a prometheus_client custom collector over AgentState, served from its own registry.

Every scrape builds fresh families from the state (nothing cached, so no stale series linger), in sections;
a section that fails is left out of that scrape, counted in attrib_collector_errors_total{section} and
logged, and the rest is still served: a scrape never fails as a whole. Series and labels are the contract
in docs/metrics.md (families.SPECS mirrors it); no label carries a request id, ids ride in exemplars.

Mount with `prometheus_client.make_asgi_app(registry_for(state))`: it negotiates OpenMetrics, the format
that carries the exemplars. The live agent serves two parts (`split_registries`): what reads the pipeline, built
on its thread and kept (exposition.py), and the small series the event loop owns (vLLM's gap, the sources'
health, the backlog and lag, build and mode), read afresh at every scrape so they are never stale.
"""

from __future__ import annotations

import logging
from collections import Counter
from collections.abc import Callable, Iterable
from typing import Final

from prometheus_client.metrics_core import Metric
from prometheus_client.process_collector import ProcessCollector
from prometheus_client.registry import Collector, CollectorRegistry

from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.engine import cost_families, kv_families, live_pipeline_families, pipeline_families
from attrib_agent.sinks.prometheus.families import SPECS, counter, empty_family
from attrib_agent.sinks.prometheus.forecast import forecast_families
from attrib_agent.sinks.prometheus.gpu import gpu_families
from attrib_agent.sinks.prometheus.health import agent_families, journal_families, source_families
from attrib_agent.sinks.prometheus.slo import slo_families
from attrib_agent.sinks.prometheus.slowdown import slowdown_families, slowed_outside_families

logger = logging.getLogger(__name__)

Section = Callable[[AgentState], list[Metric]]
# Read on the loop at every scrape: state the loop owns (gaps, health, the queue) or single numbers, all cheap.
_LIVE: Final[tuple[tuple[str, Section], ...]] = (
    ("agent", agent_families),
    ("agent", journal_families),
    ("pipeline", live_pipeline_families),
    ("sources", source_families),
)
# Read where the pipeline lives (they walk its state: the KV picture forces step inference, 10-30 ms at GPU rates).
_PIPELINE: Final[tuple[tuple[str, Section], ...]] = (
    ("slowdown", lambda state: slowdown_families(state.tally)),
    ("slowdown", lambda state: slowed_outside_families(state.pipeline.slowed_blamed_s)),
    ("slo", lambda state: slo_families(state.tally.slo)),
    ("pipeline", pipeline_families),
    ("kv", kv_families),
    ("cost", cost_families),
    ("gpu", gpu_families),
    ("forecast", forecast_families),
)
SECTIONS: Final = tuple(dict.fromkeys(name for name, _ in (*_LIVE, *_PIPELINE)))  # the `section` label's values
PARTS: Final = ("all", "pipeline", "live")


class AgentCollector(Collector):
    """Reads AgentState on each scrape. Runs on the agent's event loop (make_asgi_app bakes the output
    synchronously), so it sees the state between two events, never halfway through one."""

    def __init__(self, state: AgentState, part: str = "all", section_errors: Counter[str] | None = None) -> None:
        if part not in PARTS:
            raise ValueError(f"part must be one of {PARTS}, not {part!r}")
        self.state = state
        self.section_errors: Counter[str] = Counter({s: 0 for s in SECTIONS}) if section_errors is None \
            else section_errors
        self._builders = {"all": (*_LIVE, *_PIPELINE), "pipeline": _PIPELINE, "live": _LIVE}[part]
        self._with_errors = part != "pipeline"  # the error counter goes with the part read at every scrape

    def collect(self) -> Iterable[Metric]:
        out: list[Metric] = []
        for section, build in self._builders:
            try:
                out.extend(build(self.state))
            except Exception:  # the boundary: one broken section must not take the whole scrape down
                first = self.section_errors[section] == 0
                self.section_errors[section] += 1
                logger.warning("metrics section %s failed; its series are left out of this scrape (%d so far)",
                               section, self.section_errors[section], exc_info=first)
        if self._with_errors:
            errors = counter("attrib_collector_errors_total")
            for section in SECTIONS:
                errors.add_metric([section], self.section_errors[section])
            out.append(errors)
        return out

    def describe(self) -> Iterable[Metric]:
        """Names and types without samples, so registering the collector computes nothing."""
        return [empty_family(spec) for spec in SPECS]


def registry_for(state: AgentState, *, process_metrics: bool = False) -> CollectorRegistry:
    """A fresh registry holding only the agent's collector.

    No default collectors: in Kubernetes the kubelet already reports the sidecar container's CPU and memory
    (container_cpu_usage_seconds_total, container_memory_working_set_bytes), the numbers overhead should be
    judged by, and python_gc_* is noise; outside Kubernetes, `process_metrics=True` adds prometheus_client's
    process_* series (CPU seconds, resident memory, open fds, start time).
    """
    registry = CollectorRegistry()
    registry.register(AgentCollector(state))
    if process_metrics:
        ProcessCollector(registry=registry)
    return registry


def split_registries(state: AgentState) -> tuple[CollectorRegistry, CollectorRegistry]:
    """(pipeline part, live part): the same series as `registry_for(state)`, in two registries; the first is
    read where the pipeline lives and kept between scrapes, the second on the loop at every scrape."""
    errors: Counter[str] = Counter({s: 0 for s in SECTIONS})
    out = []
    for part in ("pipeline", "live"):
        registry = CollectorRegistry(support_collectors_without_names=True)
        registry.register(_Part(state, part, errors))
        out.append(registry)
    return out[0], out[1]


class _Part(AgentCollector):
    """One part of the agent's series. It describes nothing (which families a section yields is known only by
    running it), so its registry takes collectors without names; `name[]` filters then read every section."""

    def describe(self) -> Iterable[Metric]:
        return []
