"""The agent's own health series: build and start, each source's successes, errors and skipped input, and the
journal. `kind` values come from code, but are folded past MAX_KINDS per source all the same (fold_kinds), so
a source that invents kinds cannot grow the series count.
"""

from __future__ import annotations

from prometheus_client.metrics_core import Metric

from attrib_agent.read_model import AgentState
from attrib_agent.sinks.prometheus.families import counter, fold_kinds, gauge


def agent_families(state: AgentState) -> list[Metric]:
    build = gauge("attrib_build_info")
    build.add_metric([state.version], 1.0)
    mode = gauge("attrib_mode_info")
    mode.add_metric([state.mode()], 1.0)
    started = gauge("attrib_start_time_seconds")
    started.add_metric([], state.started_ts)
    gaps = counter("attrib_vllm_gaps_total")
    gaps.add_metric([], state.vllm_gaps)
    gap_s = gauge("attrib_vllm_gap_seconds")
    gap_s.add_metric([], state.vllm_gap_seconds())
    return [build, mode, started, gaps, gap_s]


def journal_families(state: AgentState) -> list[Metric]:
    """The journal's writes (by the sinks, at flush: after the state version they belong to, so read afresh)."""
    written = counter("attrib_journal_written_total")
    written.add_metric([], state.journal_written)
    errors = counter("attrib_journal_errors_total")
    for kind, n in fold_kinds(dict(state.journal_errors)).items():  # copied at once: the pipeline thread writes it
        errors.add_metric([kind], n)
    return [written, errors]


def source_families(state: AgentState) -> list[Metric]:
    up = gauge("attrib_source_up")
    ok = counter("attrib_source_success_total")
    errors = counter("attrib_source_errors_total")
    skipped = counter("attrib_source_skipped_total")
    last = gauge("attrib_source_last_success_timestamp_seconds")
    for name, h in list(state.health.items()):
        up.add_metric([name], 1.0 if h.up else 0.0)
        ok.add_metric([name], h.ok_total)
        for kind, n in fold_kinds(h.errors).items():
            errors.add_metric([name, kind], n)
        for kind, n in fold_kinds(h.skipped).items():
            skipped.add_metric([name, kind], n)
        if h.last_success_ts is not None:
            last.add_metric([name], h.last_success_ts)
    return [up, ok, errors, skipped, last]
