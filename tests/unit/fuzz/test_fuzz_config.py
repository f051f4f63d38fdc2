"""Fuzz the agent's configuration, each layer 10,000 times: TOML files (mutations of the documented example and
of a file setting every setting), ATTRIB_* environment variables and command-line flags with arbitrary values.
`load_config` returns a config or raises ConfigError (argparse's own ArgumentError for a flag it cannot take);
nothing else, and a config that loads can be described and turned into the pipeline's settings."""

from __future__ import annotations

import argparse
import random
import re
from pathlib import Path
from typing import Any

from .mutate import CASES, Mutator, Tally

DOCS = Path(__file__).parents[3] / "docs" / "configuration.md"
VALUES = ["", " ", "0", "1", "-1", "0.25", "1e309", "nan", "inf", "-0", "65536", "99999999999999999999", "true",
          "false", "yes", "off", "2", "64MiB", "1GiB", "500MB", "12 KB", "x", "INFO", "DEBUG", "warning", "end",
          "start", "http://127.0.0.1:8000", "http://u:p@h:1/", "grpc://c:4317", "127.0.0.1:9400", "[::]:0", ":80",
          "/", "/nonexistent/x", ".", "~", "tab\there", "é" * 50, "x" * 5000, "%s%n", "\n", "None"]


def _config() -> Any:
    """The one import of the code under test (its module path may move)."""
    from attrib_agent.config import load as config
    from attrib_agent.config import settings as config_settings
    from attrib_agent.config import types as config_types

    return config, config_settings.SETTINGS, config_types.ConfigError


def _toml_corpus(settings: Any) -> list[bytes]:
    documented = re.findall(r"```toml\n(.*?)```", DOCS.read_text(), re.S)
    sections: dict[str, list[str]] = {}
    for s in settings:
        if s.file:
            value = s.default if isinstance(s.default, bool | int | float) else s.shown_default
            if isinstance(value, bool):
                literal = str(value).lower()
            elif isinstance(value, int | float):
                literal = repr(value)
            else:
                literal = '"' + str(value).replace("\\", "\\\\").replace('"', '\\"') + '"'
            sections.setdefault(s.section, []).append(f"{s.name} = {literal}")
    full = "\n".join(f"[{sec}]\n" + "\n".join(lines) if sec else "\n".join(lines) for sec, lines in sections.items())
    return [t.encode() for t in documented] + [full.encode()]


def _check(cfg: Any) -> None:
    cfg.pipeline_config()
    assert all(isinstance(x, str) for row in cfg.describe() for x in row)
    repr(cfg)


def test_fuzz_config_file_env_and_flags(tmp_path: Path) -> None:
    config, settings, config_error = _config()
    parser = argparse.ArgumentParser(exit_on_error=False)
    config.add_run_arguments(parser)
    flags = [s for s in settings if s.flag]
    envs = [s.env for s in settings] + ["ATTRIB_CONFIG", "ATTRIB_NOT_A_SETTING"]
    mut, rng = Mutator(_toml_corpus(settings), seed=1308), random.Random(1308)
    path = tmp_path / "agent.toml"
    tallies = {layer: Tally(f"config {layer}") for layer in ("file", "env", "flags")}

    def value() -> str:
        v = rng.choice(VALUES)
        v = v if rng.random() < 0.8 else Mutator([v.encode() or b"0"], seed=rng.randrange(1 << 30)).text(2)
        return v.replace("\x00", "")  # the OS passes neither environment nor argv strings with a NUL in them

    for layer, tally in tallies.items():
        for _ in range(CASES):
            argv: list[str] = ["--vllm-url", "http://127.0.0.1:8000"] if rng.random() < 0.7 else []
            env: dict[str, str] = {}
            if layer == "file":
                path.write_bytes(mut.one(max_ops=3))
                argv += ["--config", str(path)]
            elif layer == "env":
                env = {rng.choice(envs): value() for _ in range(rng.randint(1, 4))}
            else:
                for s in rng.sample(flags, rng.randint(1, 4)):
                    if s.boolean:
                        argv.append(rng.choice([s.flag_name, "--no-" + s.flag_name[2:]]))
                    else:
                        argv.append(f"{s.flag_name}={value()}")
            try:
                args = parser.parse_args(argv)
            except argparse.ArgumentError:
                tally.add("argparse_error")
                continue
            try:
                cfg = config.load_config(args, env)
            except config_error as e:
                assert str(e) and "Traceback" not in str(e)
                tally.add("typed_error")
                continue
            _check(cfg)
            tally.add("loaded")
    for tally in tallies.values():
        tally.report()
