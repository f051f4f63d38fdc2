"""docs/configuration.md lists every setting of AgentConfig, and nothing else, with the code's names and defaults."""

from __future__ import annotations

import argparse
import inspect
import re
from dataclasses import fields
from pathlib import Path

from attrib_agent.config.load import AgentConfig, add_run_arguments, load_config
from attrib_agent.config.settings import BY_NAME, SETTINGS
from attrib_agent.sources.log.tailer import LogFollower
from attrib_agent.sources.metrics import poller as metrics_poller
from attrib_agent.sources.nvml.sampler import NvmlSampler
from attrib_agent.sources.otlp import grpc_receiver as otlp_grpc
from attrib_agent.sources.otlp import http_receiver as otlp_http

DOC = Path(__file__).parents[2] / "docs" / "configuration.md"
ROW = re.compile(r"^\| `(\w+)` \| (.+?) \| `(\w+)` \| (.+?) \| (.+?) \| (.+) \|$")


def doc_rows() -> dict[str, tuple[str, str, str, str]]:
    section = DOC.read_text().split("## Every setting", 1)[1].split("\n## ", 1)[0]
    rows = {}
    for line in section.splitlines():
        m = ROW.match(line)
        if m:
            name, flag, env, table, default, _meaning = m.groups()
            assert name not in rows, f"{name} documented twice"
            rows[name] = (flag, env, table, default)
    return rows


def setting_fields() -> set[str]:
    return {f.name for f in fields(AgentConfig) if f.metadata.get("setting", True)}


def test_docs_list_every_field_and_only_fields() -> None:
    documented = set(doc_rows())
    assert setting_fields() - documented == set(), "fields missing from docs/configuration.md"
    assert documented - setting_fields() == set(), "documented settings that AgentConfig lacks"
    assert setting_fields() == set(BY_NAME)
    assert [s.name for s in SETTINGS] == [f.name for f in fields(AgentConfig) if f.name in BY_NAME]


def test_docs_rows_match_the_code() -> None:
    for name, (flag, env, table, default) in doc_rows().items():
        s = BY_NAME[name]
        assert flag == (f"`{s.flag_name}`" if s.flag else "—"), name
        assert env == s.env, name
        assert table == (f"`[{s.section}]`" if s.file else "—"), name
        assert default == s.shown_default, name


def test_every_flag_is_documented() -> None:
    text = DOC.read_text()
    shown = [a for a in parser()._actions if a.help != argparse.SUPPRESS]
    flags = {o for a in shown for o in a.option_strings if o.startswith("--")}
    flags -= {"--help"}
    missing = {f for f in flags if f"`{f}`" not in text and not f.startswith("--no-")}
    assert missing == set()


def test_agent_config_defaults_are_the_settings_defaults() -> None:
    cfg = AgentConfig()
    for s in SETTINGS:
        assert getattr(cfg, s.name) == s.default, s.name


def test_defaults_match_the_sources_that_use_them() -> None:
    assert (BY_NAME["metrics_interval_s"].default, BY_NAME["metrics_timeout_s"].default) == (
        default_of(metrics_poller.MetricsPoller, "interval_s"), default_of(metrics_poller.MetricsPoller, "timeout_s"))
    assert BY_NAME["otlp_grpc_port"].default == otlp_grpc.DEFAULT_PORT
    assert BY_NAME["otlp_max_body_bytes"].default == otlp_grpc.DEFAULT_MAX_MESSAGE == otlp_http.DEFAULT_MAX_BODY
    assert BY_NAME["log_poll_interval_s"].default == default_of(LogFollower, "poll_interval_s")
    assert BY_NAME["nvml_interval_s"].default == default_of(NvmlSampler, "interval_s")


def default_of(cls: type, parameter: str) -> object:
    return inspect.signature(cls).parameters[parameter].default


def test_the_docs_examples_load(tmp_path: Path) -> None:
    text = DOC.read_text()
    token = tmp_path / "token"
    token.write_text("example-token\n")
    toml = text.split("```toml\n", 1)[1].split("```", 1)[0].replace("/var/run/secrets/attrib/token", str(token))
    cfg = load_config(parser().parse_args(["--config", str(write(tmp_path / "agent.toml", toml))]), {})
    assert cfg.vllm_url == "http://127.0.0.1:8000" and cfg.otlp_grpc_port == 0 and cfg.journal_max_bytes == 2**30
    assert cfg.otlp_export == cfg.otlp_forward and cfg.otlp_forward is not None and cfg.otlp_forward.protocol == "grpc"
    assert cfg.api_token is not None and cfg.warnings == ()

    yaml = text.split("```yaml\n", 1)[1].split("```", 1)[0]
    env = dict(re.findall(r'- name: (ATTRIB_\w+)\n\s+value: "([^"]*)"', yaml))
    env["ATTRIB_API_TOKEN"] = "from-a-secret"  # what valueFrom.secretKeyRef would put there
    args = re.search(r"args: \[(.*)\]", yaml)
    assert args is not None and len(env) == 5
    argv = [a.strip().strip('"') for a in args.group(1).split(",")]
    assert argv[0] == "run"
    cfg = load_config(parser().parse_args(argv[1:]), env)
    assert str(cfg.listen) == "0.0.0.0:9400" and cfg.log_file == Path("/logs/vllm.log") and cfg.warnings == ()


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    add_run_arguments(p)
    return p


def write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path
