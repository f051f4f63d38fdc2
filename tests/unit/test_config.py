"""AgentConfig through its real interface: flags from add_run_arguments, an environment mapping, a TOML file."""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

import pytest

from attrib_agent.attribution.cost_model import StepCostPrior
from attrib_agent.config.load import (
    AgentConfig,
    ConfigError,
    HostPort,
    OtlpTarget,
    Secret,
    add_run_arguments,
    load_config,
)
from attrib_agent.config.settings import BY_NAME, SETTINGS

VLLM = {"ATTRIB_VLLM_URL": "http://127.0.0.1:8000"}


def parser(live: bool = True) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="attrib-agent run")
    add_run_arguments(p, live=live)
    return p


def load(argv: list[str] | None = None, env: dict[str, str] | None = None, *, live: bool = True) -> AgentConfig:
    return load_config(parser(live).parse_args(argv or []), VLLM | (env or {}), live=live)


def toml_value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(str(value))  # a JSON string is a valid TOML basic string


def write_toml(path: Path, top: dict[str, object] | None = None, **tables: dict[str, object]) -> Path:
    lines = [f"{k} = {toml_value(v)}" for k, v in (top or {}).items()]
    for name, body in tables.items():
        lines += [f"[{name}]", *(f"{k} = {toml_value(v)}" for k, v in body.items())]
    path.write_text("\n".join(lines) + "\n")
    return path


def config_error(argv: list[str] | None = None, env: dict[str, str] | None = None, *, live: bool = True) -> str:
    with pytest.raises(ConfigError) as info:
        load(argv, env, live=live)
    message = str(info.value)
    assert "\n" not in message, "a config error is one line"
    return message


@pytest.fixture
def token_file(tmp_path: Path) -> Path:
    path = tmp_path / "token"
    path.write_text("file-token-0123\n")
    return path


def samples(tmp_path: Path, token_file: Path) -> dict[str, tuple[object, Any]]:
    """Setting -> (value as written in a file, the parsed value), one per setting; env/flags take str(value)."""
    journal = tmp_path / "journal"
    return {
        "vllm_url": ("http://vllm:8000/", "http://vllm:8000"),
        "metrics_interval_s": (0.5, 0.5),
        "metrics_timeout_s": (2.5, 2.5),
        "log_file": ("/var/log/vllm.log", Path("/var/log/vllm.log")),
        "log_stdin": (True, True),
        "log_from": ("start", "start"),
        "log_stdin_when_full": ("block", "block"),
        "log_poll_interval_s": (0.2, 0.2),
        "engine": (1, 1),
        "block_size": (32, 32),
        "num_blocks": (1000, 1000),
        "token_budget": (2048, 2048),
        "otlp_grpc_port": (14317, 14317),
        "otlp_http_port": (0, 0),
        "otlp_bind": ("::1", "::1"),
        "otlp_max_body_bytes": ("16MiB", 16 * 2**20),
        "otlp_forward": ("http://collector:4318",
                         OtlpTarget("http://collector:4318/v1/traces", "http/protobuf",
                                    "http://collector:4318/v1/traces", False)),
        "otlp_export": ("grpcs://tempo:4317", OtlpTarget("grpcs://tempo:4317", "grpc", "https://tempo:4317", True)),
        "nvml": (False, False),
        "nvml_interval_s": (2.0, 2.0),
        "listen": ("[::1]:9401", HostPort("::1", 9401)),
        "api_token": ("env-token-0123", Secret("env-token-0123")),
        "api_token_file": (str(token_file), token_file),
        "journal_dir": (str(journal), journal),
        "plugin_socket": (str(tmp_path / "plugin.sock"), tmp_path / "plugin.sock"),
        "journal_max_bytes": ("1GiB", 2**30),
        "settle_interval_s": (0.5, 0.5),
        "partial_timeout_s": (30.0, 30.0),
        "settle_margin_s": (1.5, 1.5),
        "final_horizon_s": (20.0, 20.0),
        "victim_threshold_s": (0.2, 0.2),
        "whale_factor": (4.0, 4.0),
        "max_players": (3, 3),
        "noise_floor_s": (0.05, 0.05),
        "step_cost_prior": ("0.004, 2e-6,1e-4,1e-8,1e-10,0.0005",
                            StepCostPrior(0.004, 2e-6, 1e-4, 1e-8, 1e-10, 0.0005, 1e-4)),
        "prior_min_steps": (200, 200),
        "itl_floor_ratio": (0.25, 0.25),
        "quality_floor_s": (0.01, 0.01),
        "unfinished_end_s": (600.0, 600.0),
        "window_lookback_s": (5.0, 5.0),
        "window_grid_s": (0.5, 0.5),
        "run_cache_size": (64, 64),
        "cost_tolerance": (0.05, 0.05),
        "max_results": (500, 500),
        "max_result_age_s": (600.0, 600.0),
        "max_result_bytes": ("16MiB", 16 * 2**20),
        "max_pending": (100, 100),
        "slo_ttft_s": (2.0, 2.0),
        "slo_itl_s": (0.1, 0.1),
        "shape_long_prompt_tokens": (2048, 2048),
        "shape_long_output_tokens": (512, 512),
        "forecast_horizon_s": (4.0, 4.0),
        "forecast_reference_prompt_tokens": (6000, 6000),
        "forecast_reference_max_tokens": (600, 600),
        "forecast_harmless_arrival_chance": (0.1, 0.1),
        "log_level": ("debug", "DEBUG"),
        "attribution_budget_cores": (0.5, 0.5),
        "state_dir": (str(tmp_path / "state"), tmp_path / "state"),
        "state_save_interval_s": (30, 30.0),
    }


def test_samples_cover_every_setting(tmp_path: Path, token_file: Path) -> None:
    assert set(samples(tmp_path, token_file)) == set(BY_NAME)


@pytest.mark.parametrize("layer", ["file", "env", "flag"])
def test_every_setting_through_every_layer(layer: str, tmp_path: Path, token_file: Path) -> None:
    for name, (raw, want) in samples(tmp_path, token_file).items():
        s = BY_NAME[name]
        if (layer == "file" and not s.file) or (layer == "flag" and not s.flag):
            continue
        argv: list[str] = []
        env: dict[str, str] = {}
        if layer == "file":
            argv = ["--config", str(write_toml(tmp_path / f"{name}.toml", {name: raw}))]
            source = f"file {tmp_path / f'{name}.toml'}"
            env = {"ATTRIB_VLLM_URL": ""} if name == "vllm_url" else {}
        elif layer == "env":
            env = {s.env: str(raw)}
            source = f"env {s.env}"
        else:
            argv = [s.flag_name if raw else "--no-" + s.flag_name[2:]] if s.boolean else [s.flag_name, str(raw)]
            source = f"flag {s.flag_name}"
        cfg = load(argv, env)
        assert getattr(cfg, name) == want, (layer, name)
        assert cfg.origin[name] == source, (layer, name)


def test_defaults_when_nothing_is_given() -> None:
    cfg = load()
    for s in SETTINGS:
        if s.name != "vllm_url":
            assert getattr(cfg, s.name) == s.default, s.name
            assert cfg.origin[s.name] == "default"
    assert cfg == AgentConfig(vllm_url="http://127.0.0.1:8000")
    assert cfg.listen == HostPort("127.0.0.1", 9400) and cfg.otlp_grpc_port == 4317 and cfg.otlp_http_port == 4318
    assert cfg.otlp_forward is None and cfg.otlp_export is None and cfg.api_token is None


def test_unset_flags_are_none_so_they_override_nothing() -> None:
    args = parser().parse_args([])
    assert all(getattr(args, s.name) is None for s in SETTINGS if s.flag)
    assert args.config is None


def test_precedence_file_then_env_then_flag(tmp_path: Path) -> None:
    cfg_file = write_toml(tmp_path / "a.toml", vllm={"metrics_interval_s": 0.5}, agent={"log_level": "WARNING"})
    base = ["--config", str(cfg_file)]
    cfg = load(base)
    assert (cfg.metrics_interval_s, cfg.origin["metrics_interval_s"]) == (0.5, f"file {cfg_file} [vllm]")
    cfg = load(base, {"ATTRIB_METRICS_INTERVAL_S": "0.75"})
    assert (cfg.metrics_interval_s, cfg.origin["metrics_interval_s"]) == (0.75, "env ATTRIB_METRICS_INTERVAL_S")
    assert cfg.log_level == "WARNING"  # untouched settings keep the file's value
    cfg = load([*base, "--metrics-interval-s", "1.5"], {"ATTRIB_METRICS_INTERVAL_S": "0.75"})
    assert (cfg.metrics_interval_s, cfg.origin["metrics_interval_s"]) == (1.5, "flag --metrics-interval-s")
    assert ("metrics_interval_s", "1.5", "flag --metrics-interval-s") in cfg.describe()


def test_config_file_from_env_and_flag_wins(tmp_path: Path) -> None:
    a = write_toml(tmp_path / "a.toml", {"engine": 1})
    b = write_toml(tmp_path / "b.toml", {"engine": 2})
    assert load(env={"ATTRIB_CONFIG": str(a)}).engine == 1
    assert load(["--config", str(b)], {"ATTRIB_CONFIG": str(a)}).engine == 2


def test_empty_env_var_counts_as_unset(tmp_path: Path) -> None:
    cfg_file = write_toml(tmp_path / "a.toml", {"engine": 3})
    cfg = load(["--config", str(cfg_file)], {"ATTRIB_ENGINE": "", "ATTRIB_CONFIG": ""})
    assert cfg.engine == 3


def test_bad_value_in_a_lower_layer_is_still_reported(tmp_path: Path) -> None:
    cfg_file = write_toml(tmp_path / "a.toml", {"engine": -1})
    msg = config_error(["--config", str(cfg_file), "--engine", "2"])
    assert msg.startswith(f"engine (file {cfg_file}): must be between 0 and 1023")


def test_toml_tables_group_settings(tmp_path: Path) -> None:
    cfg_file = write_toml(tmp_path / "a.toml", {"log_level": "ERROR", "nvml_interval_s": 3.0},
                          vllm={"vllm_url": "https://vllm.internal/", "engine": 2},
                          otlp={"otlp_forward": "grpc://c:4317", "otlp_grpc_port": 0},
                          nvml={"nvml": False}, api={"listen": "0.0.0.0:9500"},
                          journal={"journal_max_bytes": 5 * 2**20},
                          attribution={"whale_factor": 3, "max_results": 10})
    cfg = load(["--config", str(cfg_file)], {"ATTRIB_VLLM_URL": ""})
    assert cfg.vllm_url == "https://vllm.internal" and cfg.engine == 2 and cfg.log_level == "ERROR"
    assert cfg.otlp_forward == cfg.otlp_export == OtlpTarget("grpc://c:4317", "grpc", "c:4317", False)
    assert cfg.origin["otlp_export"] == "default (otlp_forward)"
    assert (cfg.nvml, cfg.nvml_interval_s, cfg.listen) == (False, 3.0, HostPort("0.0.0.0", 9500))
    assert (cfg.journal_max_bytes, cfg.whale_factor, cfg.max_results) == (5 * 2**20, 3.0, 10)
    assert cfg.origin["engine"] == f"file {cfg_file} [vllm]" and cfg.origin["log_level"] == f"file {cfg_file}"


@pytest.mark.parametrize("listen, want", [
    ("[::1]:9400", HostPort("::1", 9400)), ("[::]:0", HostPort("::", 0)), ("0.0.0.0:80", HostPort("0.0.0.0", 80)),
    ("localhost:9400", HostPort("localhost", 9400)), ("[fe80::1%eth0]:9400", HostPort("fe80::1%eth0", 9400)),
    ("agent.svc.cluster.local:1", HostPort("agent.svc.cluster.local", 1)),
])
def test_listen_ipv4_ipv6_and_names(listen: str, want: HostPort) -> None:
    cfg = load(["--listen", listen, "--otlp-http-port", "0", "--otlp-grpc-port", "0"])
    assert cfg.listen == want and (cfg.listen_host, cfg.listen_port) == want
    assert str(cfg.listen) == listen


def test_pipeline_config_carries_the_overrides() -> None:
    cfg = load(["--engine", "1", "--block-size", "32", "--num-blocks", "99", "--token-budget", "512",
                "--settle-interval-s", "0.5", "--partial-timeout-s", "60", "--victim-threshold-s", "0.2",
                "--whale-factor", "4", "--max-players", "3", "--noise-floor-s", "0.05", "--max-results", "7",
                "--max-result-age-s", "10", "--max-pending", "9"])
    pc = cfg.pipeline_config()
    assert (pc.engine, pc.block_size, pc.num_blocks, pc.token_budget) == (1, 32, 99, 512)
    assert (pc.settle_interval_s, pc.partial_timeout_s, pc.victim_threshold_s) == (0.5, 60.0, 0.2)
    assert (pc.max_results, pc.max_result_age_s, pc.max_pending) == (7, 10.0, 9)
    assert (pc.attribution.whale_factor, pc.attribution.max_players, pc.attribution.noise_floor_s) == (4.0, 3, 0.05)


def test_metrics_url_and_log_from() -> None:
    assert load().metrics_url == "http://127.0.0.1:8000/metrics"
    assert load(["--vllm-url", "http://h:1/metrics"]).metrics_url == "http://h:1/metrics"
    assert load(["--vllm-url", "http://h:1/prefix/"]).metrics_url == "http://h:1/prefix/metrics"
    assert load(["--log-from", "START"]).log_from_start and not load().log_from_start
    assert load(live=False, env={"ATTRIB_VLLM_URL": ""}).metrics_url is None


def test_otlp_export_follows_forward_unless_set() -> None:
    cfg = load(["--otlp-forward", "https://c.example/custom/path", "--otlp-export", "none"])
    assert cfg.otlp_forward == OtlpTarget("https://c.example/custom/path", "http/protobuf",
                                          "https://c.example/custom/path", True)
    assert cfg.otlp_export is None and cfg.origin["otlp_export"] == "flag --otlp-export"
    cfg = load(["--otlp-export", "grpc://[::1]:5317"], {"ATTRIB_OTLP_FORWARD": "off"})
    assert cfg.otlp_forward is None
    assert cfg.otlp_export == OtlpTarget("grpc://[::1]:5317", "grpc", "[::1]:5317", False)


def test_replay_serve_has_no_source_flags_and_needs_no_vllm() -> None:
    p = parser(live=False)
    with pytest.raises(SystemExit):
        p.parse_args(["--vllm-url", "http://x:1"])
    cfg = load(["--listen", "127.0.0.1:9400", "--otlp-export", "http://c:4318"], {"ATTRIB_VLLM_URL": ""}, live=False)
    assert cfg.vllm_url is None and cfg.otlp_export is not None
    # ports a replay never binds do not conflict
    assert load(["--listen", "127.0.0.1:4318"], live=False).listen.port == 4318


def test_config_is_frozen_and_hashable() -> None:
    cfg = load()
    with pytest.raises(AttributeError):
        cfg.engine = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        cfg.origin["engine"] = "x"  # type: ignore[index]
    assert hash(cfg) == hash(load())


def test_otlp_targets_fit_the_forwarder() -> None:
    from attrib_agent.sources.otlp.forward import OtlpForwarder

    for url in ("http://c:4318", "https://c/v1/traces", "grpc://c", "grpcs://[::1]:5317"):
        target = load(["--otlp-forward", url]).otlp_forward
        assert target is not None
        fwd = OtlpForwarder(target.endpoint, protocol=target.protocol)
        assert (fwd.endpoint, fwd.protocol) == (target.endpoint, target.protocol)


def test_step_cost_prior_from_a_toml_array_and_bad_priors_refused(tmp_path: Path) -> None:
    path = tmp_path / "agent.toml"
    path.write_text("[attribution]\nstep_cost_prior = [0.004, 2e-6, 1e-4, 0, 0, 0.0005]\n")
    # six numbers, written before the per-prefilling-request term: it is the per-decoding-request figure
    assert load(["--config", str(path)]).step_cost_prior == StepCostPrior(0.004, 2e-6, 1e-4, 0.0, 0.0, 0.0005, 1e-4)
    path.write_text("[attribution]\nstep_cost_prior = [0.004, 2e-6, 1e-4, 0, 0, 0.0005, 3e-4]\n")
    assert load(["--config", str(path)]).step_cost_prior.per_prefill_request_s == 3e-4
    for bad, why in (("1,2,3", "7 numbers"), ("1,2,3,4,5,x", "per_prefill_pair_s|step_gap_s"),
                     ("1,2,3,4,5,-1", "non-negative"), ("1,2,3,4,5,inf", "finite")):
        with pytest.raises(ConfigError, match="step_cost_prior") as err:
            load([], {"ATTRIB_STEP_COST_PRIOR": bad})
        assert re.search(why, str(err.value)), (bad, str(err.value))
