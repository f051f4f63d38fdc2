"""The forecast series: the harm a reference whale admitted now would do, for a router to scrape.

The reference whale's forecast (in-flight requests plus the expected arrivals, summed extra TTFT): the agent
computes it at most once per pipeline settle, off the scrape path (every SINK_FLUSH_S in its loop), and a scrape
reads the kept value (at most REFERENCE_MAX_AGE_S of event time old; older, it is computed then). While the agent
sheds load, attribution passes and the agent's refresh of this value are `pass_gap_s` apart (at most 10 s of event
time, agent/shedding.py): the gauge is then as old as the attributed results, up to that gap, rather than
re-simulated by every scrape in between (~50 ms each at GPU rates). Before any event the family has no sample
(unknown, not 0).
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from attrib_agent.read_model import REFERENCE_MAX_AGE_S, AgentState
from attrib_agent.sinks.prometheus.families import gauge


def forecast_families(state: AgentState) -> list[Metric]:
    harm = gauge("attrib_forecast_reference_harm_seconds")
    answer = state.reference_harm(max(REFERENCE_MAX_AGE_S, state.pipeline.pass_gap_s))
    if answer is not None:
        engine, seconds = answer
        harm.add_metric([str(engine)], seconds)
    return [harm]
