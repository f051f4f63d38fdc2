"""The "Interference" dashboard: what an on-call engineer opens when vLLM's p99 latency spikes.

Read top to bottom it answers: are requests slower (vLLM's own histograms)? is it interference (the agent's
attributed slowdown, by cause and culprit class, each victim's trace as an exemplar)? through which
mechanism (KV share and pressure, preemptions, queueing, step cost)? and can the agent be trusted right now
(sources up, input dropped, lag)?
"""

from __future__ import annotations

from typing import Any, Final

from dashboards.panels import RATE, Query, Section, agent, build_dashboard, heatmap, stat, timeseries, vllm, zero_lines

UID: Final = "attrib-interference"
TITLE: Final = "vLLM interference (attrib-agent)"
SHORT: Final = 'victim_class="short"'
MET: Final = 'outcome="met"'
NOT_NVML: Final = 'source!="nvml"'  # optional: a sidecar without GPU visibility keeps it down for good


def per_short_request(by: str, metric: str, *matchers: str, window: str = RATE) -> str:
    """Seconds per attributed short request: comparable across traffic levels, unlike a rate of seconds."""
    num = f"sum by ({by}) (increase({agent(metric, SHORT, *matchers)}[{window}]))" if by else \
        f"sum(increase({agent(metric, SHORT, *matchers)}[{window}]))"
    den = f"sum(increase({agent('attrib_requests_attributed_total', SHORT)}[{window}]))"
    return f"{num} / on () group_left () {den}" if by else f"{num} / {den}"


def _quantiles(metric: str, what: str) -> list[Query]:
    return [Query(f"histogram_quantile({q}, sum by (le) (rate({vllm(metric + '_bucket')}[{RATE}])))",
                  f"{what} p{round(q * 100)}", exemplar=True) for q in (0.5, 0.99)]


def _headline() -> Section:
    return Section("Now: the selected range at a glance", [
        stat("Short requests slowed", "Short requests whose slowdown over their uncontended baseline exceeded the "
             "agent's victim threshold, in the selected range, by phase.", "none",
             [Query(f"round(sum by (phase) (increase({agent('attrib_slowed_requests_total', SHORT)}[$__range])))",
                    "{{phase}}", instant=True)]),
        stat("Blamed on whales per short request", "Slowdown the agent attributed to whales in the selected range, "
             "divided by the short requests it attributed (TTFT and decode together).", "s",
             [Query(per_short_request("", "attrib_attributed_slowdown_seconds_total", 'culprit_class="whale"',
                                      window="$__range"), "whales", instant=True)], red_at=0.5),
        stat("Top request's KV share", "Share of the KV pool held by the largest request in flight now (max over "
             "the selected pods).", "percentunit",
             [Query(f"max({agent('attrib_top_request_kv_share_ratio')})", "top request")], red_at=0.5),
        stat("Whales in flight", "Requests in flight whose KV footprint makes them whales.", "none",
             [Query(f"sum({agent('attrib_whales')})", "whales")]),
        stat("Preemptions", "vLLM's preemptions in the selected range (its own counter).", "none",
             [Query(f"round(sum(increase({vllm('vllm:num_preemptions_total')}[$__range])))", "preemptions",
                    instant=True)],
             red_at=1),
        stat("Agent sources down", "Agent inputs (vLLM metrics, log, OTLP spans) whose last attempt failed: "
             "attribution is blind to what they carry. NVML is on the agent health dashboard.", "none",
             [Query(f"count({agent('attrib_source_up', NOT_NVML)} == 0) or vector(0)", "down")],
             red_at=1),
    ])


def _latency() -> Section:
    return Section("Are requests slower, and is it interference?", [
        timeseries("TTFT p50 / p99 (vLLM)", "Time to first token from vLLM's own histogram (all requests, whales "
                   "included).", "s", _quantiles("vllm:time_to_first_token_seconds", "TTFT")),
        timeseries("ITL p50 / p99 (vLLM)", "Inter-token latency from vLLM's own histogram.", "s",
                   _quantiles("vllm:inter_token_latency_seconds", "ITL")),
        heatmap("Short requests' slowdown (agent)", "Each short request's slowdown over its uncontended baseline "
                "(TTFT and decode). Exemplars are victims: a click opens the victim's trace (exemplar link of the "
                "Prometheus datasource to the trace datasource).",
                Query(f"sum by (le) (increase({agent('attrib_victim_slowdown_seconds_bucket', SHORT)}[{RATE}]))",
                      "{{le}}", exemplar=True, heatmap=True)),
    ])


def _blame() -> Section:
    return Section("Who slowed them, and through what?", [
        timeseries("Slowdown per short request, by cause", "Attributed slowdown divided by the short requests "
                   "attributed in each interval, stacked by cause; 'unexplained' is what the model could not pin on "
                   "a co-scheduled request.", "s",
                   [Query(per_short_request("cause", "attrib_attributed_slowdown_seconds_total"), "{{cause}}"),
                    Query(per_short_request("", "attrib_unexplained_slowdown_seconds_total"), "unexplained")],
                   width=12, stacked=True),
        timeseries("Slowdown per short request, by culprit class", "The same seconds split by who caused them "
                   "(whales or the crowd of other requests) and by phase.", "s",
                   [Query(per_short_request("culprit_class, phase", "attrib_attributed_slowdown_seconds_total"),
                          "{{culprit_class}} ({{phase}})")], width=6, stacked=True),
        timeseries("Victims over threshold", "Short requests slowed past the victim threshold per interval, by "
                   "phase.", "none",
                   [Query(f"sum by (phase) (increase({agent('attrib_slowed_requests_total', SHORT)}[{RATE}]))",
                          "{{phase}}")], width=6, bars=True),
    ])


def _goodput() -> Section:
    met = f"sum by (shape) (increase({agent('attrib_slo_requests_total', MET)}[{RATE}]))"
    every = f"sum by (shape) (increase({agent('attrib_slo_requests_total')}[{RATE}]))"
    blamed = f"sum by (shape, blamed_on) (increase({agent('attrib_slo_missed_blamed_seconds_total')}[{RATE}]))"
    return Section("Goodput: which traffic shapes meet their SLO, and who is to blame for the misses?", [
        timeseries("SLO compliance by traffic shape", "Share of the attributed requests of each shape (siso, silo, "
                   "liso, lilo: short or long input and output) whose TTFT and mean ITL met the agent's budgets "
                   "(slo_ttft_s, slo_itl_s), per interval.", "percentunit",
                   [Query(f"{met} / {every}", "{{shape}}")], width=12),
        timeseries("Missed requests' slowdown: whales vs crowd, by shape", "Slowdown seconds of the requests that "
                   "missed their SLO, split by what the attribution blamed: whales, the ordinary crowd, or "
                   "unexplained. Mostly whales: isolate or limit them; mostly crowd: the load itself is too high.",
                   "s", [Query(blamed, "{{shape}} {{blamed_on}}")], width=12, stacked=True),
    ])


def _kv() -> Section:
    pool = f"max by (pod) ({agent('attrib_kv_pool_blocks')})"
    return Section("KV cache: who holds it", [
        timeseries("Top request's KV share over time", "Share of the KV pool held by the largest request in flight: a "
                   "whale growing toward the whole pool is what evicts and preempts the others.", "percentunit",
                   [Query(f"max by (pod) ({agent('attrib_top_request_kv_share_ratio')})", "{{pod}} top request")]),
        timeseries("KV usage: vLLM vs agent ledger", "vLLM's own KV usage beside the agent's ledger of blocks per "
                   "request (a shared prefix counted once); the residual (vLLM minus ledger) is model error. A large "
                   "residual makes the KV causes less trustworthy.", "percentunit",
                   [Query(f"max by (pod) ({vllm('vllm:kv_cache_usage_perc')})", "{{pod}} vLLM"),
                    Query(f"max by (pod) ({agent('attrib_kv_ledger_blocks')}) / {pool}", "{{pod}} ledger"),
                    Query(f"max by (pod) ({agent('attrib_kv_ledger_residual_blocks')}) / {pool}", "{{pod}} residual")],
                   width=10),
        timeseries("Preemptions: vLLM vs agent", "vLLM's preemption counter beside the preemptions the agent's "
                   "timeline pinned on a request.", "none",
                   [Query(f"sum by (pod) (increase({vllm('vllm:num_preemptions_total')}[{RATE}]))", "{{pod}} vLLM"),
                    Query(f"sum by (pod) (increase({agent('attrib_preemptions_inferred_total')}[{RATE}]))",
                          "{{pod}} inferred")], width=6, bars=True),
    ])


def _engine() -> Section:
    return Section("Engine: queueing and step cost", [
        timeseries("Requests running / waiting (vLLM)", "Head-of-line blocking shows as waiting requests while a "
                   "whale runs.", "none",
                   [Query(f"sum by (pod) ({vllm('vllm:num_requests_running')})", "{{pod}} running"),
                    Query(f"sum by (pod) ({vllm('vllm:num_requests_waiting')})", "{{pod}} waiting")]),
        timeseries("Engine step cost", "Mean engine step time from vLLM's iteration log, and the robust residual "
                   "scale of the agent's uncontended step-cost model.", "s",
                   [Query(f"sum by (pod) (rate({agent('attrib_engine_step_seconds_total')}[{RATE}])) / "
                          f"sum by (pod) (rate({agent('attrib_engine_steps_total')}[{RATE}]))", "{{pod}} mean step"),
                    Query(f"max by (pod) ({agent('attrib_cost_model_residual_seconds')})",
                          "{{pod}} cost model residual")]),
        timeseries("Tokens per engine step (vLLM)", "Mean tokens scheduled per step: a whale's prefill chunks push "
                   "it to the batch budget (prefill contention).", "none",
                   [Query(f"sum by (pod) (rate({vllm('vllm:iteration_tokens_total_sum')}[{RATE}])) / "
                          f"sum by (pod) (rate({vllm('vllm:iteration_tokens_total_count')}[{RATE}]))", "{{pod}}")]),
    ])


def _forecast() -> Section:
    return Section("Admission: what would one more whale cost?", [
        timeseries("Forecast harm of a reference whale admitted now", "Extra TTFT, summed over the requests in "
                   "flight and those expected within the forecast horizon, that the agent forecasts admitting its "
                   "reference whale (settings forecast_reference_*) now would cause. A router can send long requests "
                   "to the pod where this is lowest (POST /v1/forecast for any size).", "s",
                   [Query(f"max by (pod, engine) ({agent('attrib_forecast_reference_harm_seconds')})",
                          "{{pod}} engine {{engine}}")], width=24),
    ])


def _health() -> Section:
    return Section("Can the agent be trusted right now?", [
        timeseries("Agent sources up", "1 when the source's last attempt succeeded.", "none",
                   [Query(f"min by (source) ({agent('attrib_source_up')})", "{{source}}")], steps=True).min(0).max(1),
        timeseries("Agent input dropped", "Input the agent skipped (malformed, unknown, too large, queue full), "
                   "per second, by source and kind; zero lines per source when nothing was dropped.", "none",
                   [Query(zero_lines(f"sum by (source, kind) (rate({agent('attrib_source_skipped_total')}[{RATE}]))",
                                     "source"), "{{source}} {{kind}}")]),
        timeseries("Agent pipeline lag", "Agent clock minus the receipt time of the last event processed: how "
                   "stale the attribution is.", "s",
                   [Query(f"max by (pod) ({agent('attrib_pipeline_lag_seconds')})", "{{pod}}")]),
    ])


def build() -> dict[str, Any]:
    """The dashboard's JSON model."""
    return build_dashboard(UID, TITLE, "Short requests' latency beside the slowdown attrib-agent blames on "
                           "co-scheduled requests (whales), with the mechanism and the agent's own health.",
                           [_headline(), _latency(), _blame(), _goodput(), _kv(), _engine(), _forecast(), _health()])
