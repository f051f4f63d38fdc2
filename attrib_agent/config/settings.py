"""Every setting of `attrib-agent run` / `replay --serve`, gathered into one table from the rows their owners declare.

A source's and a sink's rows sit in its module and come with its registration (`SourceSpec.settings`,
`SinkSpec.settings`); the pipeline's rows are `pipeline_rows.py`, each defaulting to its config dataclass's
field; the agent's own (its endpoint, its log) are here. The table drives the flags, the environment names,
the TOML keys, validation and `describe()`; docs/configuration.md is checked against it by a test.
"""

from __future__ import annotations

from typing import Any, Final

from attrib_agent.config import values as v
from attrib_agent.config.pipeline_rows import ATTRIBUTION, ENGINE, FORECAST
from attrib_agent.config.setting import ENV_PREFIX, Setting
from attrib_agent.config.types import HostPort, Secret
from attrib_agent.sinks import registry as sink_registry
from attrib_agent.sources import registry as source_registry

__all__ = ["BY_NAME", "CONFIG_ENV", "ENV_PREFIX", "EXCLUSIVE", "SECTIONS", "SETTINGS", "Setting", "gather",
           "is_chosen", "parse_token"]

CONFIG_ENV: Final = "ATTRIB_CONFIG"  # the config file's path, when no --config flag is given
# The TOML tables, in the order the table (and docs/configuration.md) lists them; a new one goes last.
SECTION_ORDER: Final = ("vllm", "otlp", "nvml", "api", "journal", "attribution", "forecast", "agent")
MAX_TOKEN_CHARS: Final = 4096


def parse_token(value: object) -> Secret:
    """A bearer token: printable ASCII without spaces (it goes in an Authorization header). Never echoed."""
    if not isinstance(value, str):
        raise ValueError(f"expected a string, got {v.type_name(value)}")
    token = value.strip()
    if not token:
        raise ValueError("the token is empty")
    if len(token) > MAX_TOKEN_CHARS or not all(33 <= ord(c) <= 126 for c in token):
        raise ValueError(f"a token is 1-{MAX_TOKEN_CHARS} printable ASCII characters without spaces")
    return Secret(token)


# The agent's own: the HTTP endpoint (/metrics, the API, the page) and its log.
API: Final[tuple[Setting[Any], ...]] = (
    Setting("listen", "api", v.host_port, HostPort("127.0.0.1", 9400),
            "address of the agent's /metrics, API and page: host:port or [IPv6]:port", "HOST:PORT"),
    Setting("api_token", "api", parse_token, None,
            "bearer token the API requires (env ATTRIB_API_TOKEN only; never a flag or file key)",
            flag=False, file=False, default_text="none: the API is open"),
    Setting("api_token_file", "api", v.path, None, "read the API token from this file (a mounted Secret)", "PATH",
            default_text="none"),
)
AGENT: Final[tuple[Setting[Any], ...]] = (
    Setting("attribution_budget_cores", "agent", v.ratio(0.01), 1.0,
            "CPU the agent may use, in cores (the whole process); beyond it a share of the requests is attributed, "
            "the rest skipped (counted)", "CORES", live=True),
    Setting("state_dir", "agent", v.path, None,
            "keep the step-cost fit here across restarts (a file per engine, written every state_save_interval_s "
            "and at exit; loaded at start when it describes the same engine)", "DIR", default_text="off"),
    Setting("state_save_interval_s", "agent", v.seconds(1), 60.0,
            "how often the step-cost fit is written to state_dir while it learns", "SECONDS"),
    Setting("log_level", "agent", v.choice(("DEBUG", "INFO", "WARNING", "ERROR"), upper=True), "INFO",
            "level of the agent's own log", "LEVEL"),
)


def gather() -> tuple[Setting[Any], ...]:
    """Every row, by table, read from the registrations now (so a source registered later has its settings)."""
    rows = [*(r for spec in source_registry.SOURCES for r in spec.settings), *ENGINE,
            *(r for spec in sink_registry.SINKS for r in spec.settings), *API, *ATTRIBUTION, *FORECAST, *AGENT]
    order = {name: i for i, name in enumerate(SECTION_ORDER)}
    rows.sort(key=lambda s: order.get(s.section, len(order)))
    seen: set[str] = set()
    for s in rows:
        if s.name in seen:
            raise ValueError(f"setting {s.name} is registered twice")
        seen.add(s.name)
    return tuple(rows)


def sections(settings: tuple[Setting[Any], ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(s.section for s in settings))


SETTINGS: Final = gather()
BY_NAME: Final = {s.name: s for s in SETTINGS}
SECTIONS: Final = sections(SETTINGS)
EXCLUSIVE: Final = (("log_file", "log_stdin"), ("api_token", "api_token_file"))  # one choice each


def is_chosen(value: Any) -> bool:
    """Whether a value picks its side of an EXCLUSIVE pair (log_stdin=false picks nothing)."""
    return value is not False and value is not None
