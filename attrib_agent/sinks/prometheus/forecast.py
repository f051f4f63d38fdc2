"""The forecast series: the harm a reference whale admitted now would do, for a router to scrape.

The reference whale's forecast (in-flight requests plus the expected arrivals, summed extra TTFT), computed at
most once per pipeline settle and read from the agent's forecast cache by every scrape after it (a scrape no
longer re-simulates on the event loop); before any event the family has no sample (unknown, not 0).
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.families import gauge


def forecast_families(state: AgentState) -> list[Metric]:
    harm = gauge("attrib_forecast_reference_harm_seconds")
    answer = state.forecast([state.forecast_settings.reference])
    if answer is not None:
        now, [f] = answer
        harm.add_metric([str(now.engine)], f.ttft_extra_sum_s)
    return [harm]
