"""The goodput series, read from the pipeline's SloTally: requests by traffic shape and SLO outcome, and the
blamed seconds of the missed ones by whale, crowd or unexplained (see attribution/slo.py for the rules).

Every combination of the closed label sets is served from the start, at zero, like the slowdown series.
"""

from __future__ import annotations

import itertools

from prometheus_client.metrics_core import Metric

from attrib_agent.attribution.slo import BLAMED_ON, OUTCOMES, SHAPES, SloTally
from attrib_agent.sinks.prometheus.families import counter


def slo_families(tally: SloTally) -> list[Metric]:
    requests = counter("attrib_slo_requests_total")
    for shape, outcome in itertools.product(SHAPES, OUTCOMES):
        requests.add_metric([shape, outcome], tally.requests.get((shape, outcome), 0))
    blamed = counter("attrib_slo_missed_blamed_seconds_total")
    for shape, on in itertools.product(SHAPES, BLAMED_ON):
        blamed.add_metric([shape, on], tally.missed_blame_s.get((shape, on), 0.0))
    return [requests, blamed]
