"""What /metrics says agrees with the pipeline it reads, after replaying real recordings: slowdown totals add
up to the final results, exemplars name real victims' traces, counters only rise, and a broken section costs
only its own series."""

from __future__ import annotations

import logging
import math
import re
from dataclasses import asdict
from pathlib import Path

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics.exposition import generate_latest as generate_openmetrics
from prometheus_client.openmetrics.parser import text_string_to_metric_families as parse_openmetrics

from attrib_agent.attribution.slo import SloConfig, outcome_of, shape_of
from attrib_agent.events import Event
from attrib_agent.pipeline import AttributionPipeline, KvNow, PipelineConfig
from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.collector import registry_for
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).resolve().parents[3] / "tests" / "fixtures" / "recordings"
Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def events(name: str) -> list[Event]:
    return list(ReplaySource(RECORDINGS / name).events())


def scrape(state: AgentState) -> dict[str, Metric]:
    text = generate_openmetrics(registry_for(state)).decode()
    return {f.name: f for f in parse_openmetrics(text)}


def value(families: dict[str, Metric], sample: str, **labels: str) -> float:
    family = families[re.sub(r"_(total|bucket|count|sum)$", "", sample)]
    return sum(s.value for s in family.samples
               if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()))


@pytest.fixture(scope="module")
def preempt() -> AgentState:
    pipeline = AttributionPipeline()
    pipeline.feed_all(events("preempt"))
    pipeline.settle()
    last = pipeline.last_event_ts
    assert last is not None
    return AgentState(pipeline, clock=lambda: last + 2.0)


def test_slowdown_seconds_add_up_to_the_final_results(preempt: AgentState) -> None:
    fams = scrape(preempt)
    finals = [r for r in preempt.pipeline.store if r.final]
    assert len(finals) == 23
    ttft = sum(r.ttft_slowdown_s for r in finals)
    itl = sum(r.itl_slowdown_s * r.itl_gaps for r in finals)
    assert ttft > 1.0 and itl > 1.0
    for phase, expected in (("ttft", ttft), ("itl", itl)):
        blamed = value(fams, "attrib_attributed_slowdown_seconds_total", phase=phase)
        unexplained = value(fams, "attrib_unexplained_slowdown_seconds_total", phase=phase)
        assert blamed > 0
        assert blamed + unexplained == pytest.approx(expected, rel=1e-9)
        assert value(fams, "attrib_victim_slowdown_seconds_sum", phase=phase) == pytest.approx(expected, rel=1e-9)
        assert value(fams, "attrib_victim_slowdown_seconds_count", phase=phase) == len(finals)


def test_request_counts_match_the_store(preempt: AgentState) -> None:
    fams = scrape(preempt)
    finals = [r for r in preempt.pipeline.store if r.final]
    whales = sum(r.is_whale for r in finals)
    assert whales == 3  # the recording's w1..w3
    assert value(fams, "attrib_requests_attributed_total", victim_class="whale") == whales
    assert value(fams, "attrib_requests_attributed_total", victim_class="short") == len(finals) - whales
    slowed_ttft = sum(r.ttft_slowdown_s >= 0.1 and not r.is_whale for r in finals)
    assert value(fams, "attrib_slowed_requests_total", phase="ttft", victim_class="short") == slowed_ttft > 0
    assert value(fams, "attrib_results_stored") == len(preempt.pipeline.store)
    store = preempt.pipeline.store  # the bytes the byte bound reads: each stored result's counted cost, summed
    assert value(fams, "attrib_results_stored_bytes") == store.bytes == sum(
        store.cost(r.request_id, store._items[r.request_id]) for r in store) > 0


def test_engine_kv_and_cost_model_values(preempt: AgentState) -> None:
    fams = scrape(preempt)
    p = preempt.pipeline
    for kind, n in (("engine_step", p.events["EngineStep"]), ("request_span", p.events["RequestSpan"])):
        assert value(fams, "attrib_events_total", kind=kind) == n > 0
    assert value(fams, "attrib_engine_steps_total") == p.steps_total == 932
    assert value(fams, "attrib_engine_step_seconds_total") == pytest.approx(p.step_seconds_total)
    assert value(fams, "attrib_preemptions_inferred_total") == len(p.timeline.preemptions()) == 1
    kv: KvNow = p.kv_now()
    assert value(fams, "attrib_kv_pool_blocks") == kv.pool_blocks == 96
    assert value(fams, "attrib_kv_ledger_blocks") == kv.ledger_blocks
    assert value(fams, "attrib_whales") == len(kv.whales)
    model = p.attributor.cost
    assert model.fitted and model.residual_scale is not None
    assert value(fams, "attrib_cost_model_fitted") == 1.0
    assert value(fams, "attrib_cost_model_residual_seconds") == pytest.approx(model.residual_scale)
    coef = {s.labels["term"]: s.value for s in fams["attrib_cost_model_coefficient"].samples}
    assert sorted(coef.values()) == pytest.approx(sorted(asdict(model.coefficients).values()))
    assert coef["intercept"] == pytest.approx(model.coefficients.intercept_s)
    assert value(fams, "attrib_pipeline_lag_seconds") == pytest.approx(2.0)
    held = {s.labels["kind"]: s.value for s in fams["attrib_timeline_held"].samples}
    assert held == p.timeline.sizes()


def test_exemplars_carry_real_victims_trace_ids(preempt: AgentState) -> None:
    fams = scrape(preempt)
    traces = {r.trace_id: r for r in preempt.pipeline.store if r.final and r.trace_id}
    buckets = [s for s in fams["attrib_victim_slowdown_seconds"].samples if s.name.endswith("_bucket")]
    with_exemplar = [s for s in buckets if s.exemplar is not None]
    assert len(with_exemplar) >= 5
    prev_le: dict[tuple[str, str], float] = {}
    for s in buckets:  # buckets come in ascending le per label set
        key = (s.labels["phase"], s.labels["victim_class"])
        lo, hi = prev_le.get(key, -math.inf), float(s.labels["le"])
        prev_le[key] = hi
        if s.exemplar is None:
            continue
        trace_id = s.exemplar.labels["trace_id"]
        assert re.fullmatch(r"[0-9a-f]{32}", trace_id)
        victim = traces[trace_id]
        slow = victim.ttft_slowdown_s if key[0] == "ttft" else victim.itl_slowdown_s * victim.itl_gaps
        assert s.exemplar.value == pytest.approx(slow)
        assert lo < s.exemplar.value <= hi


def test_no_label_value_is_a_request_id(preempt: AgentState) -> None:
    ids = {r.request_id for r in preempt.pipeline.store}
    values = {v for f in scrape(preempt).values() for s in f.samples for v in s.labels.values()}
    assert not values & ids
    assert not any("cmpl-" in v for v in values)


def test_counters_never_fall_between_scrapes() -> None:
    evs = events("whale2")
    pipeline = AttributionPipeline()
    state = AgentState(pipeline, clock=lambda: pipeline.last_event_ts or 0.0)
    scrapes: list[Samples] = []
    for part in (evs[:300], evs[300:600], evs[600:]):
        pipeline.feed_all(part)
        scrapes.append(_monotonic_samples(scrape(state)))
    pipeline.settle()
    scrapes.append(_monotonic_samples(scrape(state)))
    assert scrapes[0] != scrapes[-1]
    for before, after in zip(scrapes, scrapes[1:], strict=False):
        assert before.keys() <= after.keys(), "a series disappeared"
        fell = {k: (v, after[k]) for k, v in before.items() if after[k] < v}
        assert not fell


def _monotonic_samples(fams: dict[str, Metric]) -> Samples:
    return {(s.name, tuple(sorted(s.labels.items()))): s.value for f in fams.values()
            if f.type in ("counter", "histogram") for s in f.samples}


class BrokenKvState(AgentState):
    """A state whose KV read fails, as a read racing a mutation would ("dictionary changed size"): the read the
    section calls (the pipeline's own class may be compiled, and then cannot be subclassed)."""

    def kv_now(self) -> KvNow:
        raise RuntimeError("dictionary changed size during iteration")


def test_a_failing_section_is_counted_and_the_rest_still_served(caplog: pytest.LogCaptureFixture) -> None:
    pipeline = AttributionPipeline()
    pipeline.feed_all(events("canary"))
    state = BrokenKvState(pipeline)
    registry = registry_for(state)
    with caplog.at_level(logging.WARNING, logger="attrib_agent.sinks.prometheus.collector"):
        first = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
        second = {f.name: f for f in parse_openmetrics(generate_openmetrics(registry).decode())}
    assert "attrib_kv_pool_blocks" not in second and "attrib_whales" not in second
    assert value(second, "attrib_engine_steps_total") == pipeline.steps_total > 0
    assert value(first, "attrib_collector_errors_total", section="kv") == 1
    assert value(second, "attrib_collector_errors_total", section="kv") == 2
    assert value(second, "attrib_collector_errors_total", section="cost") == 0
    records = [r for r in caplog.records if "section kv failed" in r.getMessage()]
    assert len(records) == 2 and records[0].exc_info and not records[1].exc_info


def test_goodput_by_shape_and_the_blame_of_misses() -> None:
    """preempt's shorts (32 prompt and output tokens) wait up to 4.75 s behind three whales: with a 1 s TTFT
    budget most miss, and most of their blamed seconds are the whales'."""
    cfg = SloConfig(ttft_s=1.0, itl_s=0.25, long_prompt_tokens=1024, long_output_tokens=256)
    pipeline = AttributionPipeline(PipelineConfig(slo=cfg))
    pipeline.feed_all(events("preempt"))
    pipeline.settle()
    fams = scrape(AgentState(pipeline))
    finals = [r for r in pipeline.store if r.final]
    shorts = [r for r in finals if shape_of(r.prompt_tokens, r.completion_tokens, cfg) == "siso"]
    missed = [r for r in shorts if outcome_of(r, cfg) != "met"]
    assert len(shorts) == 20 and 0 < len(missed) < len(shorts)
    assert value(fams, "attrib_slo_requests_total", shape="siso", outcome="met") == len(shorts) - len(missed)
    assert value(fams, "attrib_slo_requests_total", shape="siso", outcome="missed_ttft") == len(missed)
    assert value(fams, "attrib_slo_requests_total") == len(finals)
    on = {k: value(fams, "attrib_slo_missed_blamed_seconds_total", shape="siso", blamed_on=k)
          for k in ("whale", "crowd", "unexplained")}
    expected = sum(r.ttft_slowdown_s + r.itl_slowdown_s * r.itl_gaps for r in missed)
    assert sum(on.values()) == pytest.approx(expected, rel=1e-9)  # a result's parts add up to its slowdown
    assert on["whale"] / sum(on.values()) > 0.5
    assert len(fams["attrib_slo_requests"].samples) == 20  # 5 shapes x 4 outcomes, from the start
