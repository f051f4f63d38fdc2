"""The agent's configuration: built-in defaults < config file < environment (`ATTRIB_*`) < command-line flags.

`add_run_arguments` adds the flags (all defaulting to None, so an unset flag overrides nothing);
`load_config` merges the layers into a frozen `AgentConfig`, or raises `ConfigError` with one line naming
the setting, its source and the problem. Every value given is validated, even one a higher layer overrides,
so a broken file is reported rather than hidden. The settings themselves are rows, gathered by `settings.py`
when called (so a source registered late has its flag, variable and key too).
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import MappingProxyType
from typing import Any
from urllib.parse import urlsplit

from attrib_agent.config.agent_config import BUILT_IN, AgentConfig
from attrib_agent.config.file import read_config_file
from attrib_agent.config.setting import ENV_PREFIX, Setting
from attrib_agent.config.settings import CONFIG_ENV, EXCLUSIVE, gather, is_chosen, parse_token
from attrib_agent.config.types import ConfigError, HostPort, OtlpTarget, Secret
from attrib_agent.config.values import WILDCARD_HOSTS, did_you_mean, expand_user, is_loopback

__all__ = ["AgentConfig", "ConfigError", "HostPort", "OtlpTarget", "Secret", "add_run_arguments", "load_config"]

# Variables Kubernetes injects for a Service named attrib-... (service links): not settings, not typos.
_SERVICE_LINK = re.compile(r"_(SERVICE_HOST|SERVICE_PORT(_\w+)?|PORT(_\d+_(TCP|UDP|SCTP)(_(PROTO|PORT|ADDR))?)?)$")


class _RefuseSecretFlag(argparse.Action):
    """`--api-token X` would put the token in `ps` and shell history: refuse it and say what to use."""

    def __call__(self, parser: argparse.ArgumentParser, namespace: argparse.Namespace, values: Any,
                 option_string: str | None = None) -> None:
        parser.error("--api-token is not accepted (a flag's value shows in `ps`): "
                     "set ATTRIB_API_TOKEN or --api-token-file FILE")


def add_run_arguments(parser: argparse.ArgumentParser, *, live: bool = True) -> None:
    """The flags of `run` (live=True) or `replay --serve` (live=False: no source flags); all default to None."""
    group = parser.add_argument_group("agent settings (flag > env ATTRIB_* > config file > default)")
    group.add_argument("--config", metavar="FILE", default=None,
                       help=f"TOML config file (env {CONFIG_ENV}); see docs/configuration.md")
    for s in gather():
        if not s.flag or (s.live and not live):
            continue
        text = f"{s.help} (default: {s.shown_default}; env {s.env})".replace("%", "%%")
        if s.boolean:
            group.add_argument(s.flag_name, dest=s.name, action=argparse.BooleanOptionalAction, default=None,
                               help=text)
        else:
            group.add_argument(s.flag_name, dest=s.name, metavar=s.metavar, default=None, help=text)
    group.add_argument("--api-token", nargs="?", action=_RefuseSecretFlag, help=argparse.SUPPRESS)


Layer = dict[str, tuple[object, str]]  # setting -> (raw value, source label)


def load_config(args: argparse.Namespace, environ: Mapping[str, str], *, live: bool = True) -> AgentConfig:
    """Merge defaults < file < env < flags; `live=False` for `replay --serve` (vllm_url not required)."""
    settings = gather()
    by_name = {s.name: s for s in settings}
    layers = [_file_layer(args, environ, settings), _env_layer(environ, settings), _flag_layer(args, settings)]
    parsed: list[dict[str, tuple[Any, str]]] = [
        {name: (_parse(by_name[name], raw, src), src) for name, (raw, src) in layer.items()} for layer in layers]
    values: dict[str, Any] = {s.name: s.default for s in settings}
    origin: dict[str, str] = {s.name: "default" for s in settings}
    for layer in parsed:
        for name, (value, src) in layer.items():
            values[name], origin[name] = value, src
    for pair in EXCLUSIVE:
        _choose_one(pair, parsed, values, origin, by_name)
    if "otlp_export" not in {n for layer in parsed for n in layer} and values["otlp_forward"] is not None:
        values["otlp_export"] = values["otlp_forward"]
        origin["otlp_export"] = "default (otlp_forward)"
    if values["api_token_file"] is not None:
        values["api_token"] = _read_token(values["api_token_file"], origin["api_token_file"])
        origin["api_token"] = f"api_token_file ({origin['api_token_file']})"
    _check_paths(values, origin)
    if live:
        _check_live(values, origin)
    warnings = tuple(_warnings(values, environ, live, settings))
    more = MappingProxyType({n: v for n, v in values.items() if n not in BUILT_IN})
    return AgentConfig(**{n: v for n, v in values.items() if n in BUILT_IN}, origin=MappingProxyType(origin),
                       warnings=warnings, more=more)


def _parse(setting: Setting[Any], raw: object, source: str) -> Any:
    try:
        return setting.parse(raw)
    except ValueError as e:
        raise ConfigError(f"{setting.name} ({source}): {e}") from None


def _file_layer(args: argparse.Namespace, environ: Mapping[str, str], settings: Sequence[Setting[Any]]) -> Layer:
    flag_path = getattr(args, "config", None)
    path = flag_path if flag_path is not None else environ.get(CONFIG_ENV) or None
    if not path:
        return {}
    try:
        expanded = expand_user(Path(path))
    except ValueError as e:
        source = "flag --config" if flag_path is not None else f"env {CONFIG_ENV}"
        raise ConfigError(f"config file ({source}): {e}") from None
    return read_config_file(expanded, settings)


def _env_layer(environ: Mapping[str, str], settings: Sequence[Setting[Any]]) -> Layer:
    # An empty variable counts as unset, as in OpenTelemetry's SDK configuration.
    return {s.name: (environ[s.env], f"env {s.env}") for s in settings if environ.get(s.env, "").strip()}


def _flag_layer(args: argparse.Namespace, settings: Sequence[Setting[Any]]) -> Layer:
    return {s.name: (getattr(args, s.name), f"flag {s.flag_name}")
            for s in settings if s.flag and getattr(args, s.name, None) is not None}


def _choose_one(pair: Sequence[str], parsed: list[dict[str, tuple[Any, str]]], values: dict[str, Any],
                origin: dict[str, str], by_name: Mapping[str, Setting[Any]]) -> None:
    """Two settings that are one choice: a higher layer's pick replaces a lower one's; one layer may not pick both."""
    top: dict[str, int] = {}
    for i, layer in enumerate(parsed):
        picked = [n for n in pair if n in layer and is_chosen(layer[n][0])]
        if len(picked) == len(pair):
            a, b = (layer[n][1] for n in pair)
            raise ConfigError(f"{pair[0]} ({a}) and {pair[1]} ({b}) are mutually exclusive: set one of them")
        top.update({n: i for n in picked})
    if len(top) == len(pair):
        winner = max(top, key=lambda n: top[n])
        for name in pair:
            if name != winner:
                values[name] = by_name[name].default
                origin[name] = f"default (replaced by {winner} from {origin[winner]})"


def _read_token(path: Path, source: str) -> Secret:
    try:
        with open(path, "rb") as f:
            data = f.read(8192)
        text = data.decode("ascii")
    except OSError as e:
        raise ConfigError(f"api_token_file ({source}): cannot read {path}: {e.strerror or type(e).__name__}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"api_token_file ({source}): {path} is not ASCII text") from None
    try:
        return parse_token(text)
    except ValueError as e:
        raise ConfigError(f"api_token_file ({source}): {path}: {e}") from None


def _check_paths(values: dict[str, Any], origin: dict[str, str]) -> None:
    for name in ("log_file", "journal_dir", "state_dir"):
        p: Path | None = values[name]
        want_dir = name != "log_file"
        if p is None:
            continue
        try:  # Path.exists() raises for a name too long, a permission denied on the way (only ENOENT is False)
            exists = p.exists()
        except OSError as e:
            why = e.strerror or type(e).__name__
            raise ConfigError(f"{name} ({origin[name]}): cannot use this path: {why}") from None
        if exists and p.is_dir() != want_dir:
            raise ConfigError(f"{name} ({origin[name]}): {p} is {'not ' if want_dir else ''}a directory")


def _check_live(values: dict[str, Any], origin: dict[str, str]) -> None:
    """What only `run` needs: a vLLM to read, receivers and the endpoint on distinct ports, no span loop."""
    if values["vllm_url"] is None:
        raise ConfigError("vllm_url (not set): required for `run`; give --vllm-url, ATTRIB_VLLM_URL or "
                          "vllm_url in the config file")
    listen: HostPort = values["listen"]
    bind: str = values["otlp_bind"]
    bound = [(n, h, p) for n, h, p in (("listen", listen.host, listen.port), ("otlp_http_port", bind,
             values["otlp_http_port"]), ("otlp_grpc_port", bind, values["otlp_grpc_port"])) if p != 0]
    for i, (name_a, host_a, port_a) in enumerate(bound):
        for name_b, host_b, port_b in bound[i + 1:]:
            if port_a == port_b and _overlap(host_a, host_b):
                raise ConfigError(f"{name_b} ({origin[name_b]}): port {port_b} is already {name_a}'s "
                                  f"({origin[name_a]}); pick another")
    target: OtlpTarget | None = values["otlp_forward"]
    if target is not None:
        fwd = _target_host_port(target)
        for name, host, port in bound:
            if name != "listen" and fwd.port == port and _overlap(fwd.host, host):
                raise ConfigError(f"otlp_forward ({origin['otlp_forward']}): {target.url} is the agent's own "
                                  f"receiver ({name}); spans would loop")


def _overlap(a: str, b: str) -> bool:
    return a == b or a in WILDCARD_HOSTS or b in WILDCARD_HOSTS or (is_loopback(a) and is_loopback(b))


def _target_host_port(target: OtlpTarget) -> HostPort:
    parts = urlsplit(target.url)
    default = 4317 if target.protocol == "grpc" else (443 if target.tls else 80)
    return HostPort(parts.hostname or "", parts.port or default)


def _warnings(values: dict[str, Any], environ: Mapping[str, str], live: bool,
              settings: Sequence[Setting[Any]]) -> list[str]:
    """Things that work but are probably not meant: unknown ATTRIB_* variables, an open API, no log source."""
    out = []
    known = {s.env for s in settings} | {CONFIG_ENV}
    for key in sorted(environ):
        if key.startswith(ENV_PREFIX) and key not in known and not _SERVICE_LINK.search(key):
            hint = did_you_mean(key, sorted(known), prefix=ENV_PREFIX)
            out.append(f"environment variable {key} is not a setting{hint}; ignored")
    listen: HostPort = values["listen"]
    if values["api_token"] is None and not is_loopback(listen.host):
        out.append(f"the API on {listen} has no token: anyone who can reach it reads request ids and timings "
                   "(set ATTRIB_API_TOKEN or api_token_file)")
    if live and values["log_file"] is None and not values["log_stdin"]:
        out.append("no vLLM log source (log_file or log_stdin): without its Iteration lines there are no engine "
                   "steps, so the step-cost model stays at its prior and results are rough")
    return out
