"""The series the agent serves, as data: one spec per family, mirroring docs/metrics.md (a test holds them equal).

The closed label-value sets live here too, so every label stays a small, known set whatever the traffic, and
the collector can pre-create each known series at zero (a rate() over a series that appears late misses its
first increment).
"""

from __future__ import annotations

import re
import typing
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Final, TypeVar

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, HistogramMetricFamily, Metric

from attrib_agent.attribution.cost_model import StepCoefficients
from attrib_agent.attribution.result import Cause
from attrib_agent.events import Event

M = TypeVar("M", CounterMetricFamily, GaugeMetricFamily)

VICTIM_CLASSES: Final = ("short", "whale")
CULPRIT_CLASSES: Final = ("whale", "crowd")
CAUSE_VALUES: Final = tuple(c.value for c in Cause)  # the traced causes, then `other`
OTHER: Final = "other"
MAX_KINDS: Final = 24  # distinct `kind` values kept per source (or for the journal); later ones fold into "other"


def snake_case(name: str) -> str:
    """`EngineStep` -> `engine_step`: event class names as label values."""
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


EVENT_KINDS: Final = tuple(snake_case(t.__name__) for t in typing.get_args(Event))
# StepCoefficients field -> term label: `per_prefill_token_s` -> `prefill_token`
COST_TERMS: Final = {f.name: f.name.removeprefix("per_").removesuffix("_s") for f in fields(StepCoefficients)}


@dataclass(frozen=True, slots=True)
class FamilySpec:
    name: str  # as exposed; counters end in _total
    type: str  # counter | gauge | histogram
    unit: str
    labels: tuple[str, ...]
    help: str


def _spec(name: str, typ: str, unit: str, labels: str, help_: str) -> FamilySpec:
    return FamilySpec(name, typ, unit, tuple(x.strip() for x in labels.split(",") if x.strip()), help_)


_SLOW = "phase, victim_class"
SPECS: Final = (
    _spec("attrib_build_info", "gauge", "", "version", "Agent version (value 1)."),
    _spec("attrib_mode_info", "gauge", "", "mode", "Which mode answers (value 1): exact while vLLM's step plugin "
          "reports the latest step, else inferred."),
    _spec("attrib_start_time_seconds", "gauge", "seconds", "",
          "Unix time the agent started (its counters restart from zero when this changes)."),
    _spec("attrib_attributed_slowdown_seconds_total", "counter", "seconds", f"{_SLOW}, culprit_class, cause",
          "Victims' slowdown blamed on culprits, by cause."),
    _spec("attrib_unexplained_slowdown_seconds_total", "counter", "seconds", _SLOW,
          "Victims' slowdown the model could not attribute."),
    _spec("attrib_victim_slowdown_seconds", "histogram", "seconds", _SLOW,
          "Slowdown of each attributed request over its uncontended baseline; exemplars carry the victim's "
          "trace_id."),
    _spec("attrib_requests_attributed_total", "counter", "", "victim_class",
          "Finished requests attributed (final results only; while the agent sheds load, those in the hash sample, "
          "which this and the other slowdown and SLO series count: see attrib_slowed_outside_share_total)."),
    _spec("attrib_slowed_requests_total", "counter", "", _SLOW,
          "Attributed requests whose slowdown exceeded the victim threshold."),
    _spec("attrib_slo_requests_total", "counter", "", "shape, outcome",
          "Attributed requests (final results) by traffic shape (siso, silo, liso, lilo by prompt and output "
          "length) and outcome against the TTFT and ITL budgets."),
    _spec("attrib_slo_missed_blamed_seconds_total", "counter", "seconds", "shape, blamed_on",
          "Slowdown of the requests that missed their SLO, by what the attribution blamed: whales, the ordinary "
          "crowd, or unexplained."),
    _spec("attrib_victims_dropped_total", "counter", "", "",
          "Victims dropped unattributed because too many were waiting (max_pending)."),
    _spec("attrib_whales", "gauge", "", "", "Requests in flight whose KV footprint makes them whales."),
    _spec("attrib_top_request_kv_share_ratio", "gauge", "ratio", "",
          "Share of the KV pool held by the largest request in flight."),
    _spec("attrib_kv_pool_blocks", "gauge", "blocks", "", "KV blocks in vLLM's pool (num_gpu_blocks)."),
    _spec("attrib_token_budget_tokens", "gauge", "tokens", "",
          "The step token budget (vLLM's max_num_batched_tokens) the re-simulation and the forecast run with."),
    _spec("attrib_token_budget_origin", "gauge", "", "origin",
          "1 for where that budget comes from, 0 for the others: configured (token_budget), announced (vLLM's "
          "start-up line), saved (that line kept in state_dir by an earlier agent), "
          "inferred (a step that cut a prefill chunk) or guessed (none of these yet: the largest "
          "step, at least 2,048; the agent may re-simulate whales in the wrong chunks)."),
    _spec("attrib_kv_ledger_blocks", "gauge", "blocks", "",
          "KV blocks the agent's ledger says are held at the last step."),
    _spec("attrib_kv_vllm_blocks", "gauge", "blocks", "",
          "KV blocks in use by vLLM's own gauge (kv_cache_usage_perc x pool) at the last sample."),
    _spec("attrib_kv_ledger_residual_blocks", "gauge", "blocks", "",
          "vLLM's blocks in use minus the ledger's at the last metrics sample (model error, and the prefix hits of "
          "requests still running, known once their span arrives)."),
    _spec("attrib_gpu_memory_used_bytes", "gauge", "bytes", "gpu", "GPU memory in use (NVML), latest reading."),
    _spec("attrib_gpu_memory_total_bytes", "gauge", "bytes", "gpu", "GPU memory installed (NVML)."),
    _spec("attrib_gpu_dram_bandwidth_ratio", "gauge", "ratio", "gpu",
          "DRAM bandwidth in use, 0..1 (GPM on Hopper and newer, else NVML memory utilisation), latest reading."),
    _spec("attrib_engine_steps_total", "counter", "", "", "Engine steps seen in vLLM's iteration log."),
    _spec("attrib_engine_step_seconds_total", "counter", "seconds", "",
          "Time vLLM reported spending in those steps."),
    _spec("attrib_preemptions_inferred_total", "counter", "", "",
          "Preemptions the timeline attributed to a request with corroborating evidence (confidence > 0.5: a lone "
          "count gap is not counted), counted when that request's result is final."),
    _spec("attrib_cost_model_coefficient", "gauge", "", "term",
          "Fitted uncontended step-cost coefficients (seconds per unit of the term)."),
    _spec("attrib_cost_model_fitted", "gauge", "", "",
          "1 once the step-cost model is fitted from quiet steps, 0 while on its prior."),
    _spec("attrib_cost_model_residual_seconds", "gauge", "seconds", "",
          "Robust scale of the step-cost model's residuals."),
    _spec("attrib_vllm_restarts_total", "counter", "", "", "vLLM restarts detected (counter resets on /metrics)."),
    _spec("attrib_vllm_gaps_total", "counter", "", "",
          "Times vLLM went unreachable or restarted while the agent ran."),
    _spec("attrib_vllm_gap_seconds", "gauge", "seconds", "",
          "How long vLLM has been unreachable in the gap open now (0 while its /metrics answers)."),
    _spec("attrib_events_total", "counter", "", "kind", "Typed events fed to the pipeline, by event kind."),
    _spec("attrib_source_up", "gauge", "", "source", "1 when the source's last attempt succeeded."),
    _spec("attrib_source_success_total", "counter", "", "source",
          "Successful reads (scrapes, OTLP exports, samples, log lines)."),
    _spec("attrib_source_errors_total", "counter", "", "source, kind", "I/O failures by kind."),
    _spec("attrib_source_skipped_total", "counter", "", "source, kind",
          "Input dropped (malformed, unknown, too large), by kind."),
    _spec("attrib_source_last_success_timestamp_seconds", "gauge", "seconds", "source",
          "Unix time of the source's last success."),
    _spec("attrib_pipeline_lag_seconds", "gauge", "seconds", "",
          "Agent clock minus the receipt time of the last event processed."),
    _spec("attrib_pipeline_backlog_events", "gauge", "", "",
          "Events received and not yet fed to the pipeline (queued or in its hands)."),
    _spec("attrib_pipeline_backlog_seconds", "gauge", "seconds", "",
          "How long the oldest event not yet fed to the pipeline has waited (0 when none)."),
    _spec("attrib_attributed_share_ratio", "gauge", "", "",
          "Share of finishing requests attributed now: 1, or less while the agent sheds load "
          "(attribution_budget_cores)."),
    _spec("attrib_victims_skipped_total", "counter", "", "",
          "Requests left unattributed because the agent shed load (status `skipped` in the API)."),
    _spec("attrib_slowed_outside_share_total", "counter", "", "outcome",
          "Requests the shed share left out that finished visibly slowed (a phase slowed past the victim threshold "
          "over the step-cost model's time alone): `attributed` all the same (final results, `chosen_by` slowed; "
          "not in the sample the slowdown and SLO series count), or `skipped` past the bound the CPU budget sets "
          "(counted in attrib_victims_skipped_total too)."),
    _spec("attrib_slowed_outside_share_slowdown_seconds_total", "counter", "seconds", "cause",
          "Slowdown of the requests the shed share left out and attributed all the same as visibly slowed "
          "(attrib_slowed_outside_share_total{outcome=\"attributed\"}), blamed on culprits (whales and the crowd), "
          "by cause: what slowed the tail while the agent sheds load. Apart from "
          "attrib_attributed_slowdown_seconds_total, which counts the hash sample only (its rates stay unbiased)."),
    _spec("attrib_results_stored", "gauge", "", "", "Attribution results held for the API."),
    _spec("attrib_results_stored_bytes", "gauge", "bytes", "",
          "Memory the stored results count against max_result_bytes (packed; RSS is ~1.1x this)."),
    _spec("attrib_results_evicted_total", "counter", "", "",
          "Results dropped by the store's count, byte or age bound."),
    _spec("attrib_timeline_held", "gauge", "", "kind",
          "Items the timeline holds (steps, requests, samples): the memory bounds at work."),
    _spec("attrib_journal_written_total", "counter", "", "", "Results appended to the journal."),
    _spec("attrib_journal_errors_total", "counter", "", "kind", "Journal write or read failures."),
    _spec("attrib_forecast_reference_harm_seconds", "gauge", "seconds", "engine",
          "Extra TTFT, summed over the requests in flight and those expected within the forecast horizon, that "
          "admitting the reference whale now would cause (POST /v1/forecast for any size)."),
    _spec("attrib_collector_errors_total", "counter", "", "section",
          "Scrapes in which a section of this collector failed (its series were left out of that scrape)."),
)
SPECS_BY_NAME: Final = {s.name: s for s in SPECS}


def _checked(name: str, typ: str) -> FamilySpec:
    spec = SPECS_BY_NAME[name]
    if spec.type != typ:
        raise TypeError(f"{name} is a {spec.type}, not a {typ}")
    return spec


def counter(name: str) -> CounterMetricFamily:
    s = _checked(name, "counter")
    return CounterMetricFamily(s.name, s.help, labels=s.labels, unit=s.unit)


def gauge(name: str) -> GaugeMetricFamily:
    s = _checked(name, "gauge")
    return GaugeMetricFamily(s.name, s.help, labels=s.labels, unit=s.unit)


def one(family: M, value: float) -> M:
    """A family with its one unlabelled sample (most of the agent's own series)."""
    family.add_metric([], value)
    return family


def histogram(name: str) -> HistogramMetricFamily:
    s = _checked(name, "histogram")
    return HistogramMetricFamily(s.name, s.help, labels=s.labels, unit=s.unit)


def empty_family(spec: FamilySpec) -> Metric:
    """A family with no samples: what `describe()` returns, so registering never computes anything."""
    return {"counter": counter, "gauge": gauge, "histogram": histogram}[spec.type](spec.name)


def fold_kinds(counts: Mapping[str, int]) -> dict[str, int]:
    """The first MAX_KINDS kinds in first-seen order (dicts and Counters keep it), the rest summed as "other".

    First-seen order is stable as counts grow, so no series vanishes and "other" only rises: counters stay
    monotonic while a source that invents kinds cannot grow the series count.
    """
    out: dict[str, int] = {}
    for kind, n in counts.items():
        key = kind if kind == OTHER or len(out) < MAX_KINDS or kind in out else OTHER
        out[key] = out.get(key, 0) + n
    return out
