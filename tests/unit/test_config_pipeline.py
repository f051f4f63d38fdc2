"""The configured pipeline on a real recording: the overrides reach the pipeline and change what it keeps."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_config import load, samples, write_toml

from attrib_agent.attribution.cost_model import StepCostPrior
from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.config import ConfigError
from attrib_agent.config.pipeline_rows import ATTRIBUTION, ENGINE, FORECAST
from attrib_agent.config.setting import field_of
from attrib_agent.events import Event
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

PREEMPT = Path(__file__).parents[1] / "fixtures" / "recordings" / "preempt"


@pytest.fixture(scope="module")
def events() -> list[Event]:
    return list(ReplaySource(PREEMPT).events())


def run(pipeline: AttributionPipeline, events: list[Event]) -> AttributionPipeline:
    for ev in events:
        pipeline.feed(ev)
    pipeline.settle()
    return pipeline


def test_default_config_gives_the_default_pipelines_results(events: list[Event]) -> None:
    configured = run(AttributionPipeline(load().pipeline_config()), events)
    plain = run(AttributionPipeline(), events)
    assert len(configured.store) == len(plain.store) == 23
    assert [to_dict(r) for r in configured.store] == [to_dict(r) for r in plain.store]
    assert any(c.is_whale for r in plain.store for c in r.culprits)
    assert sum(plain.tally.slowed.values()) > 0


def test_file_env_and_flag_overrides_reach_the_pipeline(events: list[Event], tmp_path: Path) -> None:
    cfg_file = write_toml(tmp_path / "agent.toml", attribution={"max_results": 100, "victim_threshold_s": 10.0})
    cfg = load(["--config", str(cfg_file), "--max-results", "5"], {"ATTRIB_WHALE_FACTOR": "1000"})
    p = run(AttributionPipeline(cfg.pipeline_config()), events)
    assert len(p.store) == 5 and p.store.evicted > 0  # the flag's bound, not the file's
    assert not any(c.is_whale for r in p.store for c in r.culprits)  # nobody holds 1000x the median
    assert sum(p.tally.requests.values()) == 23 and sum(p.tally.slowed.values()) == 0  # nobody 10 s slower


def test_slo_budgets_and_shape_thresholds_reach_the_goodput_tally(events: list[Event], tmp_path: Path) -> None:
    default = run(AttributionPipeline(load().pipeline_config()), events).tally.slo
    assert default.requests[("siso", "met")] == 20  # preempt's shorts: 32 tokens in and out, TTFT < 5 s
    cfg_file = write_toml(tmp_path / "agent.toml", attribution={"slo_ttft_s": 1.0})
    cfg = load(["--config", str(cfg_file), "--shape-long-output-tokens", "16"], {"ATTRIB_SLO_ITL_S": "0.5"})
    slo = run(AttributionPipeline(cfg.pipeline_config()), events).tally.slo
    assert (slo.config.ttft_s, slo.config.itl_s, slo.config.long_output_tokens) == (1.0, 0.5, 16)
    assert not any(shape == "siso" for shape, _ in slo.requests)  # 32 output tokens are now long
    assert slo.requests[("silo", "missed_ttft")] > 0  # shorts queued 1-5 s behind the whales


def test_the_step_cost_prior_and_its_step_count_reach_the_cost_model(events: list[Event], tmp_path: Path) -> None:
    gpu = "0.004,2e-6,1e-4,1e-8,1e-10,0.0005"
    cfg_file = write_toml(tmp_path / "agent.toml", attribution={"step_cost_prior": gpu})
    cfg = load(["--config", str(cfg_file), "--prior-min-steps", "1024"], {"ATTRIB_UNFINISHED_END_S": "60"})
    p = run(AttributionPipeline(cfg.pipeline_config()), events)
    cost = p.attributor.cost
    assert cost.prior == StepCostPrior(0.004, 2e-6, 1e-4, 1e-8, 1e-10, 0.0005, 1e-4)
    assert not cost.fitted and cost.coefficients.as_tuple() == cost.prior.as_tuple()  # never enough steps
    plain = run(AttributionPipeline(load().pipeline_config()), events)
    assert plain.attributor.cost.fitted  # the recording's steps replace the default prior
    assert [r.ttft_baseline_s for r in p.store] != [r.ttft_baseline_s for r in plain.store]


@pytest.mark.parametrize(("env", "value"), [("ATTRIB_SLO_TTFT_S", "0"), ("ATTRIB_SHAPE_LONG_PROMPT_TOKENS", "0")])
def test_bad_slo_settings_are_refused(env: str, value: str) -> None:
    with pytest.raises(ConfigError, match=env.removeprefix("ATTRIB_").lower()):
        load([], {env: value})


def test_every_pipeline_row_sets_its_field(tmp_path: Path) -> None:
    """No field-by-field copy to forget: each [attribution]/[vllm] engine row lands in PipelineConfig at its target,
    each [forecast] row in ForecastSettings, and the forecast's SLOs are the goodput ones."""
    given = samples(tmp_path, tmp_path / "token")
    env = {s.env: str(given[s.name][0]) for s in ENGINE + ATTRIBUTION + FORECAST}
    cfg = load([], env)
    pipeline, forecast = cfg.pipeline_config(), cfg.forecast_settings()
    for s in ENGINE + ATTRIBUTION:
        assert s.target is not None and field_of(pipeline, s.target) == given[s.name][1] != s.default, s.name
    for s in FORECAST:
        assert s.target is not None and field_of(forecast, s.target) == given[s.name][1] != s.default, s.name
    assert (forecast.config.ttft_slo_s, forecast.config.itl_p95_slo_s) == (pipeline.slo.ttft_s, pipeline.slo.itl_s)
    assert (pipeline.settle_margin_s, pipeline.final_horizon_s) == (1.5, 20.0)


@pytest.mark.parametrize(("env", "value"), [("ATTRIB_SETTLE_MARGIN_S", "-0.1"), ("ATTRIB_FINAL_HORIZON_S", "0")])
def test_bad_finality_settings_are_refused(env: str, value: str) -> None:
    with pytest.raises(ConfigError, match=env.removeprefix("ATTRIB_").lower()):
        load([], {env: value})
