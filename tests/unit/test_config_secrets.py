"""The API token and URL passwords never show: not in repr, str, describe(), origins, warnings or errors."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
from test_config import config_error, load, write_toml

from attrib_agent.config.load import AgentConfig, Secret

TOKEN = "tok-CANARY-7f3a9c"
PASSWORD = "pw-CANARY-41b2"


def visible_text(cfg: AgentConfig) -> str:
    return "\n".join([repr(cfg), str(cfg), *map(str, cfg.describe()), *cfg.origin.values(), *cfg.warnings])


def test_env_token_is_masked_everywhere() -> None:
    cfg = load(["--vllm-url", f"http://agent:{PASSWORD}@vllm:8000"], {"ATTRIB_API_TOKEN": TOKEN})
    assert cfg.api_token is not None and cfg.api_token.reveal() == cfg.reveal_api_token() == TOKEN
    assert load().reveal_api_token() is None
    text = visible_text(cfg)
    assert TOKEN not in text and PASSWORD not in text
    rows = {name: (value, source) for name, value, source in cfg.describe()}
    assert rows["api_token"] == ("***", "env ATTRIB_API_TOKEN")
    assert rows["vllm_url"] == ("http://agent:***@vllm:8000", "flag --vllm-url")
    assert "api_token=***" in repr(cfg)
    assert cfg.metrics_url == f"http://agent:{PASSWORD}@vllm:8000/metrics"  # the poller needs the real one


def test_token_file_is_read_and_masked(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN + "\n")
    cfg = load(["--api-token-file", str(f)])
    assert cfg.api_token == Secret(TOKEN)
    assert TOKEN not in visible_text(cfg)
    rows = {name: (value, source) for name, value, source in cfg.describe()}
    assert rows["api_token"] == ("***", "api_token_file (flag --api-token-file)")
    assert rows["api_token_file"] == (str(f), "flag --api-token-file")


def test_token_file_from_a_higher_layer_replaces_the_env_token(tmp_path: Path) -> None:
    f = tmp_path / "token"
    f.write_text(TOKEN)
    cfg = load(["--api-token-file", str(f)], {"ATTRIB_API_TOKEN": "env-token"})
    assert cfg.api_token == Secret(TOKEN)
    cfg_file = write_toml(tmp_path / "a.toml", api={"api_token_file": str(f)})
    cfg = load(["--config", str(cfg_file)], {"ATTRIB_API_TOKEN": "env-token"})
    assert cfg.api_token == Secret("env-token") and cfg.api_token_file is None
    assert cfg.origin["api_token_file"] == "default (replaced by api_token from env ATTRIB_API_TOKEN)"


def test_a_rejected_token_is_not_echoed(tmp_path: Path) -> None:
    bad = TOKEN + " with space"
    assert TOKEN not in config_error(env={"ATTRIB_API_TOKEN": bad})
    f = tmp_path / "token"
    f.write_text(bad)
    assert TOKEN not in config_error(["--api-token-file", str(f)])
    cfg_file = tmp_path / "a.toml"
    cfg_file.write_text(f'api_token = "{TOKEN}"\n')
    msg = config_error(["--config", str(cfg_file)])
    assert TOKEN not in msg and "set ATTRIB_API_TOKEN or api_token_file" in msg


def test_secret_value_object() -> None:
    s = Secret(TOKEN)
    assert repr(s) == "Secret('***')" and str(s) == "***" and f"{s}" == "***"
    assert s == Secret(TOKEN) and s != Secret("other") and s != TOKEN
    assert hash(s) == hash(Secret(TOKEN))


def test_no_log_record_carries_the_token(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.DEBUG):
        load(["--listen", "0.0.0.0:9400"], {"ATTRIB_API_TOKEN": TOKEN, "ATTRIB_BOGUS": "1"})
    assert all(TOKEN not in r.getMessage() for r in caplog.records)


def test_warnings() -> None:
    cfg = load(env={"ATTRIB_METRICS_INTERVAL": "0.5", "ATTRIB_AGENT_SERVICE_HOST": "10.0.0.1",
                    "ATTRIB_AGENT_PORT_9400_TCP_ADDR": "10.0.0.1", "ATTRIB_AGENT_PORT": "tcp://10.0.0.1:9400",
                    "OTHER": "x"})
    assert cfg.warnings[0] == ("environment variable ATTRIB_METRICS_INTERVAL is not a setting "
                               "(did you mean `ATTRIB_METRICS_INTERVAL_S`?); ignored")
    assert not any("SERVICE_HOST" in w or "PORT_9400" in w or "AGENT_PORT" in w for w in cfg.warnings)
    assert cfg.warnings[1].startswith("no vLLM log source (log_file or log_stdin)")
    assert len(cfg.warnings) == 2
    open_api = load(["--listen", "[::]:9400", "--log-stdin"]).warnings
    assert open_api == ("the API on [::]:9400 has no token: anyone who can reach it reads request ids and timings "
                        "(set ATTRIB_API_TOKEN or api_token_file)",)
    assert load(["--listen", "[::]:9400", "--log-stdin"], {"ATTRIB_API_TOKEN": TOKEN}).warnings == ()
    assert load(["--listen", "[::1]:9400", "--log-file", "/v.log"]).warnings == ()
