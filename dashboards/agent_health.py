"""The "Agent health" dashboard: is attrib-agent itself reading, keeping up and staying inside its bounds?

The Interference dashboard carries a one-row summary of this; here is the detail an operator needs when
that row is red: which source fails and how, what input is dropped, where the memory bounds stand, and
whether the step-cost model (the baseline every slowdown is measured against) is fitted.
"""

from __future__ import annotations

from typing import Any, Final

from dashboards.panels import RATE, Query, Section, agent, build_dashboard, stat, timeseries, zero_lines

UID: Final = "attrib-agent-health"
TITLE: Final = "attrib-agent health"


def _summary() -> Section:
    return Section("Summary", [
        stat("Version", "attrib-agent versions running in the selected pods.", "none",
             [Query(f"count by (version) ({agent('attrib_build_info')})", "{{version}}")], show="name"),
        stat("Sources down", "Sources whose last attempt failed.", "none",
             [Query(f"count({agent('attrib_source_up')} == 0) or vector(0)", "down")], red_at=1),
        stat("Cost model fitted", "1 when the step-cost model is fitted from quiet steps, 0 while on its prior "
             "(slowdowns are then rough). Minimum over the selected pods.", "none",
             [Query(f"min({agent('attrib_cost_model_fitted')})", "fitted")]),
        stat("vLLM restarts", "vLLM restarts the agent detected in the selected range.", "none",
             [Query(f"round(sum(increase({agent('attrib_vllm_restarts_total')}[$__range])))", "restarts",
                    instant=True)],
             red_at=1),
        stat("Results held", "Attribution results held for the API (bounded by count and age).", "none",
             [Query(f"sum({agent('attrib_results_stored')})", "results")]),
        stat("Pipeline lag", "Worst lag over the selected pods.", "s",
             [Query(f"max({agent('attrib_pipeline_lag_seconds')})", "lag")], red_at=30),
    ])


def _sources() -> Section:
    return Section("Sources: vLLM metrics, log, OTLP spans, NVML", [
        timeseries("Source up", "1 when the source's last attempt succeeded.", "none",
                   [Query(f"min by (pod, source) ({agent('attrib_source_up')})", "{{pod}} {{source}}")],
                   steps=True).min(0).max(1),
        timeseries("Successful reads", "Scrapes, log lines, OTLP exports and samples read per second.", "reqps",
                   [Query(f"sum by (source) (rate({agent('attrib_source_success_total')}[{RATE}]))", "{{source}}")]),
        timeseries("Time since last success", "How long each source has gone without a successful read.", "s",
                   [Query(f"time() - max by (source) ({agent('attrib_source_last_success_timestamp_seconds')})",
                          "{{source}}")]),
        timeseries("I/O errors", "Failures per second by source and kind (timeout, refused, http_5xx ...).", "reqps",
                   [Query(zero_lines(f"sum by (source, kind) (rate({agent('attrib_source_errors_total')}[{RATE}]))",
                                      "source"), "{{source}} {{kind}}")], width=12),
        timeseries("Input dropped", "Input skipped per second by source and kind (malformed, unknown_line, "
                   "too_large, queue_full ...).", "reqps",
                   [Query(zero_lines(f"sum by (source, kind) (rate({agent('attrib_source_skipped_total')}[{RATE}]))",
                                      "source"), "{{source}} {{kind}}")], width=12),
    ])


def _pipeline() -> Section:
    return Section("Pipeline", [
        timeseries("Events fed", "Typed events fed to the pipeline per second, by kind.", "reqps",
                   [Query(f"sum by (kind) (rate({agent('attrib_events_total')}[{RATE}]))", "{{kind}}")]),
        timeseries("Engine steps and attributed requests", "Engine steps seen in vLLM's iteration log and finished "
                   "requests attributed, per second.", "reqps",
                   [Query(f"sum by (pod) (rate({agent('attrib_engine_steps_total')}[{RATE}]))", "{{pod}} steps"),
                    Query(f"sum by (pod, victim_class) (rate({agent('attrib_requests_attributed_total')}[{RATE}]))",
                          "{{pod}} attributed ({{victim_class}})")]),
        timeseries("Pipeline lag", "Agent clock minus the receipt time of the last event processed.", "s",
                   [Query(f"max by (pod) ({agent('attrib_pipeline_lag_seconds')})", "{{pod}}")]),
    ])


def _shedding() -> Section:
    return Section("Shedding (attribution_budget_cores)", [
        timeseries("Attributed share", "Share of finishing requests the agent attributes now: 1, or less while it "
                   "sheds load to stay inside attribution_budget_cores (a hash-chosen, unbiased sample).",
                   "percentunit",
                   [Query(f"min by (pod) ({agent('attrib_attributed_share_ratio')})", "{{pod}}")],
                   steps=True).min(0).max(1),
        timeseries("Requests skipped", "Requests left unattributed per second while shedding (the API answers "
                   "skipped), and those outside the share that finished visibly slowed: attributed all the same, "
                   "or skipped past the bound.", "reqps",
                   [Query(f"sum by (pod) (rate({agent('attrib_victims_skipped_total')}[{RATE}]))", "{{pod}} skipped"),
                    Query(f"sum by (pod, outcome) (rate({agent('attrib_slowed_outside_share_total')}[{RATE}]))",
                          "{{pod}} slowed, {{outcome}}")]),
        timeseries("Slowed outside the share, by cause", "Slowdown per second of the visibly slowed requests "
                   "attributed outside the shed share, by cause: the tail while the sample's series stay "
                   "unbiased.", "s",
                   [Query(f"sum by (cause) (rate({agent('attrib_slowed_outside_share_slowdown_seconds_total')}"
                          f"[{RATE}]))", "{{cause}}")], stacked=True),
    ])


def _bounds() -> Section:
    return Section("Memory bounds", [
        timeseries("Timeline items held", "Steps, requests and samples the timeline holds: flat lines mean the "
                   "bounds are working.", "none",
                   [Query(f"sum by (kind) ({agent('attrib_timeline_held')})", "{{kind}}")], width=6),
        timeseries("Results held", "Attribution results held for the API, bounded by count, bytes and age.", "none",
                   [Query(f"sum by (pod) ({agent('attrib_results_stored')})", "{{pod}}")], width=4),
        timeseries("Results memory", "Bytes the stored results count against max_result_bytes (RSS is ~1.1x): a "
                   "flat line at the bound means the oldest are going early.", "bytes",
                   [Query(f"sum by (pod) ({agent('attrib_results_stored_bytes')})", "{{pod}}")], width=5),
        timeseries("Results evicted", "Results dropped per second by the store's count, byte or age bound.", "reqps",
                   [Query(f"sum by (pod) (rate({agent('attrib_results_evicted_total')}[{RATE}]))", "{{pod}}")],
                   width=4),
        timeseries("Journal", "Results appended to the journal per second, and journal failures by kind.", "reqps",
                   [Query(f"sum by (pod) (rate({agent('attrib_journal_written_total')}[{RATE}]))", "{{pod}} written"),
                    Query(zero_lines(f"sum by (kind) (rate({agent('attrib_journal_errors_total')}[{RATE}]))",
                                      "pod"), "errors {{kind}}")], width=5),
    ])


def _cost_model() -> Section:
    return Section("Step-cost model (the uncontended baseline)", [
        timeseries("Step-cost coefficients", "Fitted seconds per unit of each term (per step, per prefill token, "
                   "per decode sequence, per KV block ...).", "s",
                   [Query(f"max by (pod, term) ({agent('attrib_cost_model_coefficient')})", "{{pod}} {{term}}")],
                   width=12),
        timeseries("Cost model residual", "Robust scale of the model's residuals: a rising residual means the "
                   "baseline fits vLLM's steps less well (the summary's 'Cost model fitted' says whether it left its "
                   "prior).", "s",
                   [Query(f"max by (pod) ({agent('attrib_cost_model_residual_seconds')})", "{{pod}}")], width=12),
    ])


def build() -> dict[str, Any]:
    """The dashboard's JSON model."""
    sections = [_summary(), _sources(), _pipeline(), _shedding(), _bounds(), _cost_model()]
    return build_dashboard(UID, TITLE, "attrib-agent's own health: sources, dropped input, lag, shedding, memory "
                           "bounds and the step-cost model.", sections)
