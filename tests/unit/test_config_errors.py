"""Every way a configuration is refused: one line naming the setting, its source and what is wrong."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_config import config_error, load, parser, write_toml

from attrib_agent.config.load import load_config


@pytest.mark.parametrize("argv, env, expected", [
    # URLs
    (["--vllm-url", "localhost:8000"], {}, "vllm_url (flag --vllm-url): expected a URL starting http://, https://, "
     "got 'localhost:8000'"),
    ([], {"ATTRIB_VLLM_URL": "ftp://h/x"}, "vllm_url (env ATTRIB_VLLM_URL): expected a URL starting http://, https://"),
    (["--vllm-url", "http://"], {}, "vllm_url (flag --vllm-url): no host in URL"),
    (["--vllm-url", "http://h:99999"], {}, "vllm_url (flag --vllm-url): bad port in URL"),
    (["--vllm-url", "http://h/ x"], {}, "vllm_url (flag --vllm-url): a URL has no spaces"),
    (["--vllm-url", "http://h:1/?a=b"], {}, "vllm_url (flag --vllm-url): a base URL has no query"),
    (["--otlp-forward", "collector:4317"], {}, "otlp_forward (flag --otlp-forward): expected a URL starting http://, "
     "https://, grpc://, grpcs:// (the scheme picks the protocol), got 'collector:4317'"),
    (["--otlp-export", "grpc://c:4317/v1/traces"], {}, "otlp_export (flag --otlp-export): a grpc:// URL is only"),
    # ports and addresses
    (["--otlp-grpc-port", "70000"], {}, "otlp_grpc_port (flag --otlp-grpc-port): must be between 0 and 65535"),
    ([], {"ATTRIB_OTLP_HTTP_PORT": "-1"}, "otlp_http_port (env ATTRIB_OTLP_HTTP_PORT): must be between 0 and 65535"),
    (["--otlp-http-port", "http"], {}, "otlp_http_port (flag --otlp-http-port): expected a whole number, got 'http'"),
    (["--listen", "::1:9400"], {}, "listen (flag --listen): an IPv6 address needs brackets, e.g. [::1]:9400"),
    (["--listen", "9400"], {}, "listen (flag --listen): expected host:port"),
    (["--listen", ":9400"], {}, "listen (flag --listen): missing host in ':9400': use 0.0.0.0:9400"),
    (["--listen", "[::1]9400"], {}, "listen (flag --listen): expected [IPv6]:port"),
    (["--listen", "[::g]:9400"], {}, "listen (flag --listen): '::g' is not an IPv6 address"),
    (["--listen", "300.1.1.1:9400"], {}, "listen (flag --listen): '300.1.1.1' is not an IPv4 address"),
    (["--listen", "bad_host:9400"], {}, "listen (flag --listen): 'bad_host' is not a valid host name"),
    (["--listen", "h:port"], {}, "listen (flag --listen): expected a whole number, got 'port'"),
    (["--otlp-bind", "a..b"], {}, "otlp_bind (flag --otlp-bind): 'a..b' is not a valid host name"),
    (["--otlp-bind=-x"], {}, "otlp_bind (flag --otlp-bind): '-x' is not a valid host name"),
    # numbers
    (["--metrics-interval-s", "-1"], {}, "metrics_interval_s (flag --metrics-interval-s): must be at least 0.05 s"),
    ([], {"ATTRIB_METRICS_INTERVAL_S": "0.01"}, "metrics_interval_s (env ATTRIB_METRICS_INTERVAL_S): must be at "
     "least 0.05 s, got 0.01"),
    (["--metrics-timeout-s", "0"], {}, "metrics_timeout_s (flag --metrics-timeout-s): must be more than 0 s"),
    (["--nvml-interval-s", "nan"], {}, "nvml_interval_s (flag --nvml-interval-s): must be a finite number"),
    (["--settle-interval-s", "inf"], {}, "settle_interval_s (flag --settle-interval-s): must be a finite number"),
    (["--victim-threshold-s", "-0.1"], {}, "victim_threshold_s (flag --victim-threshold-s): must be at least 0 s"),
    (["--whale-factor", "1"], {}, "whale_factor (flag --whale-factor): must be more than 1"),
    (["--max-players", "11"], {}, "max_players (flag --max-players): must be between 1 and 10"),
    (["--max-results", "0"], {}, "max_results (flag --max-results): must be between 1 and"),
    (["--engine", "1.5"], {}, "engine (flag --engine): expected a whole number, got '1.5'"),
    (["--journal-max-bytes", "12 parsecs"], {}, "journal_max_bytes (flag --journal-max-bytes): expected a size"),
    (["--journal-max-bytes", "1KiB"], {}, "journal_max_bytes (flag --journal-max-bytes): must be between 1048576"),
    # words
    (["--log-level", "chatty"], {}, "log_level (flag --log-level): must be one of DEBUG, INFO, WARNING, ERROR"),
    (["--log-from", "middle"], {}, "log_from (flag --log-from): must be one of end, start"),
    ([], {"ATTRIB_NVML": "maybe"}, "nvml (env ATTRIB_NVML): expected true/false"),
    (["--log-file", " "], {}, "log_file (flag --log-file): expected a path, got an empty string"),
])
def test_bad_values(argv: list[str], env: dict[str, str], expected: str) -> None:
    assert config_error(argv, env).startswith(expected)


def test_run_needs_vllm_url() -> None:
    assert config_error(env={"ATTRIB_VLLM_URL": ""}).startswith("vllm_url (not set): required for `run`")


def test_password_in_a_bad_url_is_masked() -> None:
    msg = config_error(["--vllm-url", "http://user:hunter2@h:99999"])
    assert "hunter2" not in msg and "user:***@" in msg


@pytest.mark.parametrize("text, expected", [
    ("metrics_intervl_s = 0.5\n", "metrics_intervl_s (file {f}): unknown setting (did you mean `metrics_interval_s`?)"),
    ("[vlm]\nengine = 1\n", "[vlm] (file {f}): unknown table (did you mean `vllm`?)"),
    ("[extras]\nx = 1\n", "[extras] (file {f}): unknown table (tables: vllm, otlp, nvml, api, journal"),
    ("[otlp]\nengine = 1\n", "engine (file {f} [otlp]): belongs in [vllm] or at the top level"),
    ("engine = 1\n[vllm]\nengine = 2\n", "engine (file {f} [vllm]): also set in file {f}; keep one"),
    ("[vllm.extra]\nengine = 1\n", "[vllm.extra] (file {f}): tables do not nest"),
    ("api_token = 'abc'\n", "api_token (file {f}): not accepted in a config file"),
    ("engine = '1.0'\n", "engine (file {f}): expected a whole number, got '1.0'"),
    ("engine = 1.0\n", "engine (file {f}): expected a whole number, got float"),
    ("metrics_interval_s = 'fast'\n", "metrics_interval_s (file {f}): expected a number, got 'fast'"),
    ("metrics_interval_s = true\n", "metrics_interval_s (file {f}): expected a number, got boolean"),
    ("nvml = 'yes please'\n", "nvml (file {f}): expected true/false"),
    ("nvml = 1\n", "nvml (file {f}): expected true/false (or 1/0, yes/no, on/off), got integer"),
    ("listen = 9400\n", "listen (file {f}): expected host:port, got integer"),
    ("log_file = ['a']\n", "log_file (file {f}): expected a path, got array"),
    ("journal_max_bytes = 1979-05-27\n", "journal_max_bytes (file {f}): expected a whole number, got date/time"),
    ("engine = \n", "config file {f}: not valid TOML: "),
])
def test_bad_config_files(tmp_path: Path, text: str, expected: str) -> None:
    f = tmp_path / "agent.toml"
    f.write_text(text)
    assert config_error(["--config", str(f)]).startswith(expected.format(f=f))


def test_unreadable_unsized_and_binary_config_files(tmp_path: Path) -> None:
    missing = tmp_path / "nope.toml"
    assert config_error(["--config", str(missing)]) == (
        f"config file {missing}: cannot read it: No such file or directory")
    assert config_error(env={"ATTRIB_CONFIG": str(tmp_path)}).startswith(f"config file {tmp_path}: cannot read it")
    big = tmp_path / "big.toml"
    big.write_text("# padding\n" * 200_000)  # 2 MB: read no further than the limit
    assert config_error(["--config", str(big)]).endswith("larger than 1048576 bytes; is it the right file?")
    binary = tmp_path / "bin.toml"
    binary.write_bytes(b"engine = 1\n\xff\xfe")
    assert config_error(["--config", str(binary)]) == f"config file {binary}: not UTF-8 text"


def test_log_file_and_log_stdin_in_one_layer(tmp_path: Path) -> None:
    assert config_error(["--log-file", "/v.log", "--log-stdin"]) == (
        "log_file (flag --log-file) and log_stdin (flag --log-stdin) are mutually exclusive: set one of them")
    assert config_error(env={"ATTRIB_LOG_FILE": "/v.log", "ATTRIB_LOG_STDIN": "1"}).startswith(
        "log_file (env ATTRIB_LOG_FILE) and log_stdin (env ATTRIB_LOG_STDIN) are mutually exclusive")
    f = write_toml(tmp_path / "a.toml", vllm={"log_file": "/v.log", "log_stdin": True})
    assert config_error(["--config", str(f)]).startswith(f"log_file (file {f} [vllm]) and log_stdin (file {f} [vllm])")


def test_log_file_and_log_stdin_across_layers_higher_wins(tmp_path: Path) -> None:
    f = write_toml(tmp_path / "a.toml", {"log_file": "/v.log"})
    cfg = load(["--config", str(f), "--log-stdin"])
    assert cfg.log_stdin and cfg.log_file is None
    assert cfg.origin["log_file"] == "default (replaced by log_stdin from flag --log-stdin)"
    cfg = load(["--log-file", "/w.log"], {"ATTRIB_LOG_STDIN": "true"})
    assert str(cfg.log_file) == "/w.log" and not cfg.log_stdin
    cfg = load(["--config", str(f), "--no-log-stdin"])  # false picks nothing: the file's log_file stays
    assert str(cfg.log_file) == "/v.log" and not cfg.log_stdin


def test_path_kinds(tmp_path: Path) -> None:
    assert config_error(["--log-file", str(tmp_path)]) == f"log_file (flag --log-file): {tmp_path} is a directory"
    f = tmp_path / "file"
    f.write_text("x")
    assert config_error(["--journal-dir", str(f)]) == f"journal_dir (flag --journal-dir): {f} is not a directory"


def test_port_conflicts() -> None:
    assert config_error(["--listen", "127.0.0.1:4318"]).startswith(
        "otlp_http_port (default): port 4318 is already listen's (flag --listen); pick another")
    assert config_error(["--otlp-grpc-port", "5000", "--otlp-http-port", "5000"]).startswith(
        "otlp_grpc_port (flag --otlp-grpc-port): port 5000 is already otlp_http_port's")
    assert config_error(["--listen", "[::]:4317"]).startswith("otlp_grpc_port (default): port 4317 is already")
    assert config_error(["--listen", "localhost:4317"]).startswith("otlp_grpc_port (default): port 4317")
    # different addresses, or a receiver turned off, do not conflict
    assert load(["--listen", "10.0.0.5:4318"]).listen.port == 4318
    assert load(["--listen", "127.0.0.1:4318", "--otlp-http-port", "0"]).otlp_http_port == 0
    assert load(["--otlp-grpc-port", "0", "--otlp-http-port", "0"]).otlp_grpc_port == 0


def test_forwarding_to_the_agents_own_receiver_is_refused() -> None:
    assert config_error(["--otlp-forward", "http://127.0.0.1:4318/v1/traces"]).startswith(
        "otlp_forward (flag --otlp-forward): http://127.0.0.1:4318/v1/traces is the agent's own receiver "
        "(otlp_http_port); spans would loop")
    assert config_error(["--otlp-forward", "grpc://localhost"]).startswith("otlp_forward (flag --otlp-forward): "
                                                                           "grpc://localhost:4317 is the agent's own")
    assert config_error(["--otlp-forward", "http://[::1]:4318", "--otlp-bind", "::", "--listen", "[::1]:0"]).startswith(
        "otlp_forward (flag --otlp-forward): http://[::1]:4318/v1/traces is the agent's own receiver (otlp_http_port)")
    assert load(["--otlp-forward", "http://127.0.0.1:14318"]).otlp_forward is not None
    assert load(["--otlp-forward", "http://127.0.0.1:4318", "--otlp-bind", "10.0.0.5"]).otlp_forward is not None
    assert load(["--otlp-forward", "http://127.0.0.1:4318", "--otlp-http-port", "0"]).otlp_forward is not None


def test_api_token_flag_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    for argv in (["--api-token", "abc"], ["--api-token"]):
        with pytest.raises(SystemExit):
            parser().parse_args(argv)
        err = capsys.readouterr().err
        assert "--api-token is not accepted" in err and "ATTRIB_API_TOKEN" in err and "abc" not in err


@pytest.mark.parametrize("content, expected", [
    ("", "the token is empty"),
    ("\n\n", "the token is empty"),
    ("two words", "a token is 1-4096 printable ASCII characters without spaces"),
    ("x" * 5000, "a token is 1-4096 printable ASCII characters without spaces"),
])
def test_bad_token_files(tmp_path: Path, content: str, expected: str) -> None:
    f = tmp_path / "token"
    f.write_text(content)
    msg = config_error(["--api-token-file", str(f)])
    assert msg == f"api_token_file (flag --api-token-file): {f}: {expected}"


def test_unreadable_and_binary_token_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing"
    assert config_error(env={"ATTRIB_API_TOKEN_FILE": str(missing)}) == (
        f"api_token_file (env ATTRIB_API_TOKEN_FILE): cannot read {missing}: No such file or directory")
    f = tmp_path / "bin"
    f.write_bytes("tök€n".encode())
    assert config_error(["--api-token-file", str(f)]) == (
        f"api_token_file (flag --api-token-file): {f} is not ASCII text")
    big = tmp_path / "big"
    big.write_bytes(b"y" * 3_000_000)  # read no more than a few KB of it
    assert "printable ASCII" in config_error(["--api-token-file", str(big)])


def test_token_from_env_and_token_file_in_one_layer(tmp_path: Path) -> None:
    f = tmp_path / "t"
    f.write_text("abc")
    assert config_error(env={"ATTRIB_API_TOKEN": "x", "ATTRIB_API_TOKEN_FILE": str(f)}) == (
        "api_token (env ATTRIB_API_TOKEN) and api_token_file (env ATTRIB_API_TOKEN_FILE) are mutually exclusive: "
        "set one of them")


def test_load_config_reads_only_the_mapping_it_is_given(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ATTRIB_ENGINE", "not a number")
    cfg = load_config(parser().parse_args(["--vllm-url", "http://h:1"]), {})
    assert cfg.engine == 0
