"""The forecast gauge reads a kept value: computed once per settle at most (the agent's loop refreshes it), a
scrape within REFERENCE_MAX_AGE_S of event time reads it without simulating, an older one computes it."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from attrib_agent.events import RequestReceived
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.read_model import REFERENCE_MAX_AGE_S, AgentState
from attrib_agent.sinks.prometheus.forecast import forecast_families
from attrib_agent.sources.replay import ReplaySource

WHALE2 = Path(__file__).resolve().parents[2] / "fixtures" / "recordings" / "whale2"


def state_at_second_whale() -> tuple[AgentState, list[RequestReceived]]:
    p = AttributionPipeline()
    events = list(ReplaySource(WHALE2).events())
    for i, ev in enumerate(events):
        if isinstance(ev, RequestReceived) and "-w2-" in ev.request_id:
            return AgentState(p), [e for e in events[i:] if isinstance(e, RequestReceived)]
        p.feed(ev)
    raise AssertionError("whale2: w2 never arrives")


def test_scrapes_read_the_kept_value_until_it_is_too_old() -> None:
    state, later = state_at_second_whale()
    first = state.refresh_reference()
    assert first is not None and first[1] > 0
    built = state.forecasts.built
    assert state.refresh_reference() == first and state.forecasts.built == built  # same settle: a no-op
    [fam] = forecast_families(state)
    assert [s.value for s in fam.samples] == [first[1]]
    p = state.pipeline
    p.feed(replace(later[0], ts=p.last_event_ts + REFERENCE_MAX_AGE_S / 4))  # settles: a newer state
    assert state.reference_harm() == first and state.forecasts.built == built  # young enough: kept
    p.feed(replace(later[1], ts=p.last_event_ts + REFERENCE_MAX_AGE_S))
    assert state.reference_harm() is not None and state.forecasts.built == built + 1  # too old: computed


def test_no_sample_before_any_event() -> None:
    [fam] = forecast_families(AgentState(AttributionPipeline()))
    assert fam.samples == []


def test_while_shedding_a_scrape_reads_the_value_kept_for_the_pass_gap() -> None:
    state, later = state_at_second_whale()
    first = state.refresh_reference()
    built = state.forecasts.built
    p = state.pipeline
    p.pass_gap_s = 4 * REFERENCE_MAX_AGE_S  # shedding: passes (and the agent's refresh) this far apart
    p.feed(replace(later[0], ts=p.last_event_ts + 2 * REFERENCE_MAX_AGE_S))
    [fam] = forecast_families(state)
    assert [s.value for s in fam.samples] == [first[1]] and state.forecasts.built == built  # within the gap: kept
    p.feed(replace(later[1], ts=p.last_event_ts + 2 * REFERENCE_MAX_AGE_S))
    forecast_families(state)
    assert state.forecasts.built == built + 1  # a gap old: computed
