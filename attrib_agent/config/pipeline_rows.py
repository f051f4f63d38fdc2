"""The pipeline's settings: each row sets one field of `PipelineConfig` (the `[attribution]` table and the
engine facts of `[vllm]`) or of `ForecastSettings` (`[forecast]`), and takes its default from that field.

So the dataclasses beside the pipeline and the attributor hold each default once, and `pipeline_config()`
is the rows' values put into a default `PipelineConfig` (`setting.build`), not a field-by-field copy.
The forecast counts requests pushed past the goodput SLOs (`slo_ttft_s`, `slo_itl_s`): one pair of budgets.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any, Final

from attrib_agent.attribution.cost_model import FIT_WINDOW, StepCostPrior
from attrib_agent.attribution.forecast import ForecastSettings
from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting, build, field_setting
from attrib_agent.pipeline import PipelineConfig

_P, _F = PipelineConfig(), ForecastSettings()


def _p(name: str, target: str, parse: Any, help: str, metavar: str = "VALUE", *, section: str = "attribution",
       **kw: Any) -> Setting[Any]:
    return field_setting(_P, name, target, section, parse, help, metavar, **kw)


def _f(name: str, target: str, parse: Any, help: str, metavar: str) -> Setting[Any]:
    return field_setting(_F, name, target, "forecast", parse, help, metavar)


# The engine facts the agent would otherwise infer: [vllm], with the sources that read vLLM.
ENGINE: Final[tuple[Setting[Any], ...]] = (
    _p("engine", "engine", v.count(0, 1023), "which vLLM engine (data-parallel rank) to attribute", "INDEX",
       section="vllm"),
    _p("block_size", "block_size", v.count(1, 65536), "KV block size in tokens", "TOKENS", section="vllm",
       default_text="from vllm:cache_config_info"),
    _p("num_blocks", "num_blocks", v.count(1, 2**31), "KV blocks in the pool", "BLOCKS", section="vllm",
       default_text="from vllm:cache_config_info"),
    _p("token_budget", "token_budget", v.count(1, 2**31), "vLLM's max_num_batched_tokens", "TOKENS",
       section="vllm", default_text="inferred from the engine steps"),
)
ATTRIBUTION: Final[tuple[Setting[Any], ...]] = (
    _p("settle_interval_s", "settle_interval_s", v.seconds(0.01), "event time between attribution passes",
       "SECONDS"),
    _p("partial_timeout_s", "partial_timeout_s", v.seconds(1),
       "a partial result becomes final this long after its request finished", "SECONDS"),
    _p("settle_margin_s", "settle_margin_s", v.seconds(0),
       "event time past a request's finish before its result can be final (a log line written just before "
       "the finish may be read late); not waited when vLLM's log has millisecond stamps and has been read past "
       "the finish", "SECONDS"),
    _p("final_horizon_s", "final_horizon_s", v.seconds(0, inclusive=False),
       "a request in flight this long without a span (lost, or stuck) no longer keeps the results it "
       "overlapped partial", "SECONDS"),
    _p("victim_threshold_s", "victim_threshold_s", v.seconds(0), "slowdown that counts a request as slowed",
       "SECONDS"),
    _p("whale_factor", "attribution.whale_factor", v.ratio(1.0),
       "a request holding this many times the median KV footprint is a whale", "FACTOR"),
    _p("max_players", "attribution.max_players", v.count(1, 10),
       "whales per busy period given exact Shapley values (2^n simulations each)", "N"),
    _p("noise_floor_s", "attribution.noise_floor_s", v.seconds(0),
       "TTFT slowdown below this (or half the solo TTFT) counts as no interference", "SECONDS"),
    _p("step_cost_prior", "attribution.step_cost_prior", StepCostPrior.parse,
       "step costs used until prior_min_steps steps are fitted: intercept, per prefill token, per decoding "
       "request, per decode context token, per prefill pair, step gap, per prefilling request (seconds; default "
       "fitted on a 2-core CPU; six numbers: the last is the per decoding request figure)",
       "A,B,C,D,E,F,G"),
    _p("prior_min_steps", "attribution.prior_min_steps", v.count(1, FIT_WINDOW),
       "engine steps seen before the step costs are fitted from them instead of taken from step_cost_prior", "N"),
    _p("itl_floor_ratio", "attribution.itl_floor_ratio", v.ratio(0.0),
       "the uncontended ITL is at least this times the cost model's solo ITL", "FACTOR"),
    _p("quality_floor_s", "attribution.quality_floor_s", v.seconds(0.001),
       "TTFTs shorter than this are compared at this scale in a result's quality", "SECONDS"),
    _p("unfinished_end_s", "attribution.unfinished_end_s", v.seconds(1),
       "a request not yet finished is simulated as running this long after its arrival", "SECONDS"),
    _p("window_lookback_s", "attribution.window_lookback_s", v.seconds(0),
       "under continuous load a victim is re-simulated from the engine state observed at most this long before "
       "it arrived", "SECONDS"),
    _p("window_grid_s", "attribution.window_grid_s", v.seconds(0),
       "re-simulation windows start on multiples of this, so nearby victims share their runs", "SECONDS"),
    _p("run_cache_size", "attribution.run_cache_size", v.count(0, 100_000),
       "re-simulation runs kept for reuse across victims and settle passes", "N"),
    _p("cost_tolerance", "attribution.cost_tolerance", v.ratio(0.0),
       "a step-cost refit reprices the re-simulations only when it moves a step's price by more than this "
       "fraction", "FRACTION"),
    _p("max_results", "max_results", v.count(1, 10_000_000), "results kept in memory for the API", "N"),
    _p("max_result_age_s", "max_result_age_s", v.seconds(1), "results older than this are dropped from memory",
       "SECONDS"),
    _p("max_result_bytes", "max_result_bytes", v.size_bytes(2**20, 2**40),
       "memory the results kept for the API may take, packed (the oldest go first)", "BYTES", default_text="40MiB"),
    _p("max_pending", "max_pending", v.count(1, 10_000_000),
       "victims waiting for attribution or refinement (the oldest are dropped beyond)", "N"),
    _p("slo_ttft_s", "slo.ttft_s", v.seconds(0, inclusive=False),
       "TTFT budget of the goodput series and of the forecast", "SECONDS"),
    _p("slo_itl_s", "slo.itl_s", v.seconds(0, inclusive=False),
       "ITL budget of the goodput series (mean) and of the forecast (p95)", "SECONDS"),
    _p("shape_long_prompt_tokens", "slo.long_prompt_tokens", v.count(1, 10_000_000),
       "prompts this long are long (li*) in the goodput series' shapes", "TOKENS"),
    _p("shape_long_output_tokens", "slo.long_output_tokens", v.count(1, 10_000_000),
       "outputs this long are long (*lo) in the goodput series' shapes", "TOKENS"),
)
# The admission forecast (POST /v1/forecast, attrib_forecast_reference_harm_seconds).
FORECAST: Final[tuple[Setting[Any], ...]] = (
    _f("forecast_horizon_s", "config.horizon_s", v.seconds(0.1),
       "how far ahead a forecast runs the expected arrivals", "SECONDS"),
    _f("forecast_reference_prompt_tokens", "reference.prompt_tokens", v.count(1, 10_000_000),
       "prompt of the reference whale whose harm the gauge reports", "TOKENS"),
    _f("forecast_reference_max_tokens", "reference.max_tokens", v.count(1, 10_000_000),
       "max_tokens of the reference whale", "TOKENS"),
    _f("forecast_harmless_arrival_chance", "config.harmless_arrival_chance", v.ratio(0.0),
       "a stream of unknown phase: harmless only if its next arrival is less likely to land behind the candidate",
       "CHANCE"),
)


def pipeline_config(values: Mapping[str, Any]) -> PipelineConfig:
    """The pipeline's config: every engine and attribution row's value in its field."""
    return build(_P, ENGINE + ATTRIBUTION, values)


def forecast_settings(values: Mapping[str, Any]) -> ForecastSettings:
    """The forecast's settings, its SLOs the goodput ones."""
    settings = build(_F, FORECAST, values)
    slo = dataclasses.replace(settings.config, ttft_slo_s=values["slo_ttft_s"], itl_p95_slo_s=values["slo_itl_s"])
    return dataclasses.replace(settings, config=slo)
