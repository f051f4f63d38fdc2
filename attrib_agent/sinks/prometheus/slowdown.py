"""The slowdown series, read from the pipeline's SlowdownTally: blame by cause, the unexplained rest, the
per-victim histogram (exemplars name the victim's trace so Grafana can jump to it), and request counts; and
apart, the blame by cause of the results taken outside the shed share as visibly slowed.

Every label combination of the closed sets is served from the start (at zero), so dashboards see a series
before its first increment.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Mapping
from typing import Final

from prometheus_client.metrics_core import Metric
from prometheus_client.samples import Exemplar

from attrib_agent.attribution.tally import PHASES, SlowdownHistogram, SlowdownTally
from attrib_agent.attribution.tally import Exemplar as TallyExemplar
from attrib_agent.sinks.prometheus.families import (
    CAUSE_VALUES,
    CULPRIT_CLASSES,
    OTHER,
    VICTIM_CLASSES,
    counter,
    histogram,
)

_TRACE_ID: Final = re.compile(r"[0-9a-f]{32}")
_Bucket = tuple[str, float] | tuple[str, float, Exemplar]


def slowdown_families(tally: SlowdownTally) -> list[Metric]:
    attributed = counter("attrib_attributed_slowdown_seconds_total")
    blamed = dict.fromkeys(itertools.product(PHASES, VICTIM_CLASSES, CULPRIT_CLASSES, CAUSE_VALUES), 0.0)
    for (phase, vc, cc, cause), seconds in tally.attributed_s.items():
        key = (phase, vc, cc, cause if cause in CAUSE_VALUES else OTHER)
        blamed[key] = blamed.get(key, 0.0) + seconds
    for labels, seconds in blamed.items():
        attributed.add_metric(list(labels), seconds)

    unexplained = counter("attrib_unexplained_slowdown_seconds_total")
    slowed = counter("attrib_slowed_requests_total")
    hist = histogram("attrib_victim_slowdown_seconds")
    pairs = dict.fromkeys(itertools.product(PHASES, VICTIM_CLASSES))
    pairs.update(dict.fromkeys(tally.histograms))
    for phase, vc in pairs:
        unexplained.add_metric([phase, vc], tally.unexplained_s.get((phase, vc), 0.0))
        slowed.add_metric([phase, vc], tally.slowed.get((phase, vc), 0))
        h = tally.histograms.get((phase, vc)) or SlowdownHistogram()
        hist.add_metric([phase, vc], _buckets(h), h.total)

    requests = counter("attrib_requests_attributed_total")
    for vc in dict.fromkeys((*VICTIM_CLASSES, *tally.requests)):
        requests.add_metric([vc], tally.requests.get(vc, 0))
    return [attributed, unexplained, hist, requests, slowed]


def slowed_outside_families(blamed: Mapping[str, float]) -> list[Metric]:
    """The slowdown of the results taken outside the shed share as visibly slowed, by cause (the pipeline's
    `slowed_blamed_s`): a family of its own, since summed into the sample's series it would bias their rates
    towards the tail. Every cause is served from the start."""
    family = counter("attrib_slowed_outside_share_slowdown_seconds_total")
    for cause in dict.fromkeys((*CAUSE_VALUES, *blamed)):
        family.add_metric([cause], blamed.get(cause, 0.0))
    return [family]


def _buckets(h: SlowdownHistogram) -> list[_Bucket]:
    rows: list[_Bucket] = []
    for le, count, ex in h.cumulative():
        exemplar = _exemplar(ex)
        rows.append((le, float(count)) if exemplar is None else (le, float(count), exemplar))
    return rows


def _exemplar(ex: TallyExemplar | None) -> Exemplar | None:
    """An OpenMetrics exemplar, only for a well-formed W3C trace id (anything else would not link anywhere)."""
    if ex is None or not _TRACE_ID.fullmatch(ex.trace_id) or ex.trace_id == "0" * 32:
        return None
    return Exemplar({"trace_id": ex.trace_id}, ex.value, ex.ts)
