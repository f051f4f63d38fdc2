"""The forecast series: the harm a reference whale admitted now would do, for a router to scrape.

One forecast per scrape (in-flight requests plus the expected arrivals, summed extra TTFT); before any event
the family has no sample (unknown, not 0).
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from attrib_agent.agent_state import AgentState
from attrib_agent.attribution.forecast import forecast
from attrib_agent.attribution.forecast_state import engine_state, forecast_cost
from attrib_agent.sinks.prom_families import gauge


def forecast_families(state: AgentState) -> list[Metric]:
    harm = gauge("attrib_forecast_reference_harm_seconds")
    p = state.pipeline
    now = engine_state(p)
    if now is not None:
        f = forecast(now, [state.forecast.reference], forecast_cost(p), state.forecast.config)[0]
        harm.add_metric([str(p.config.engine)], f.ttft_extra_sum_s)
    return [harm]
