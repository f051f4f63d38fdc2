"""The engine-side series: what the pipeline has seen and holds, the KV picture now, and the step-cost model.

An unknown value (pool size before vLLM's cache config arrives, the residual before the fit) is served as a
family with no sample, Prometheus' way of saying "unknown" that 0 would not be.
"""

from __future__ import annotations

from dataclasses import asdict

from prometheus_client.metrics_core import GaugeMetricFamily, Metric

from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.families import COST_TERMS, EVENT_KINDS, counter, gauge, one, snake_case
from attrib_agent.timeline.engine_timeline import BUDGET_SOURCES


def pipeline_families(state: AgentState) -> list[Metric]:
    """Counters of what went through the pipeline, and the bounded stores' current sizes."""
    p = state.stats()
    events = counter("attrib_events_total")
    by_kind = dict.fromkeys(EVENT_KINDS, 0)
    for name, n in p.events.items():
        kind = snake_case(name)
        by_kind[kind] = by_kind.get(kind, 0) + n
    for kind, n in by_kind.items():
        events.add_metric([kind], n)

    steps = one(counter("attrib_engine_steps_total"), p.steps_total)
    step_s = one(counter("attrib_engine_step_seconds_total"), p.step_seconds_total)
    restarts = one(counter("attrib_vllm_restarts_total"), p.vllm_restarts)
    preemptions = one(counter("attrib_preemptions_inferred_total"), p.preemptions_inferred)
    dropped = one(counter("attrib_victims_dropped_total"), p.dropped_pending)

    stored = one(gauge("attrib_results_stored"), p.results_stored)
    evicted = one(counter("attrib_results_evicted_total"), p.results_evicted)
    stored_bytes = one(gauge("attrib_results_stored_bytes"), p.results_bytes)
    held = gauge("attrib_timeline_held")
    for kind, n in p.timeline_held.items():
        held.add_metric([kind], n)
    return [events, steps, step_s, restarts, preemptions, dropped, stored, stored_bytes, evicted, held]


def live_pipeline_families(state: AgentState) -> list[Metric]:
    """How far behind the stream the pipeline is, and what the agent sheds to keep up: the clock against single
    numbers any thread may read (the last event's time, the queue), so afresh at every scrape."""
    lag = gauge("attrib_pipeline_lag_seconds")
    last = state.pipeline.last_event_ts
    if last is not None:
        lag.add_metric([], state.clock() - last)
    b = state.pipeline_backlog()
    events = one(gauge("attrib_pipeline_backlog_events"), b.events)
    waited = one(gauge("attrib_pipeline_backlog_seconds"), b.oldest_s)
    share = one(gauge("attrib_attributed_share_ratio"), b.attributed_share)
    skipped = one(counter("attrib_victims_skipped_total"), b.victims_skipped)
    slowed = counter("attrib_slowed_outside_share_total")
    slowed.add_metric(["attributed"], b.slowed_attributed)
    slowed.add_metric(["skipped"], b.slowed_skipped)
    return [lag, events, waited, share, skipped, slowed]


def kv_families(state: AgentState) -> list[Metric]:
    """The KV pool at the latest step: whales in flight, the largest holder's share, ledger versus vLLM."""
    kv = state.kv_now()
    whales = gauge("attrib_whales")
    whales.add_metric([], len(kv.whales))
    share = gauge("attrib_top_request_kv_share_ratio")
    share.add_metric([], kv.top_share)
    ledger = gauge("attrib_kv_ledger_blocks")
    ledger.add_metric([], kv.ledger_blocks)
    budget = one(gauge("attrib_token_budget_tokens"), state.token_budget())
    origin, now = gauge("attrib_token_budget_origin"), state.token_budget_source()
    for name in BUDGET_SOURCES:  # a closed set, each always present: 1 for where the budget comes from now
        origin.add_metric([name], 1.0 if name == now else 0.0)
    return [whales, share, _maybe("attrib_kv_pool_blocks", kv.pool_blocks), budget, origin, ledger,
            _maybe("attrib_kv_vllm_blocks", kv.vllm_blocks),
            _maybe("attrib_kv_ledger_residual_blocks", kv.residual_blocks)]


def cost_families(state: AgentState) -> list[Metric]:
    """The uncontended step-cost model every baseline comes from: is it fitted, to what, how well."""
    model = state.cost_model
    coef = gauge("attrib_cost_model_coefficient")
    for field, value in asdict(model.coefficients).items():
        coef.add_metric([COST_TERMS[field]], value)
    fitted = gauge("attrib_cost_model_fitted")
    fitted.add_metric([], 1.0 if model.fitted else 0.0)
    return [coef, fitted, _maybe("attrib_cost_model_residual_seconds", model.residual_scale)]


def _maybe(name: str, value: float | None) -> GaugeMetricFamily:
    fam = gauge(name)
    if value is not None:
        fam.add_metric([], value)
    return fam
