"""The loaded settings: `AgentConfig`, one field per row of the table, the class made from the rows themselves.

A setting is declared once, as its row (beside its source, sink or config dataclass); the frozen dataclass is
generated from `settings.SETTINGS`, so `cfg.metrics_interval_s` needs no second declaration. A row
registered after start-up (a test's toy source) is kept in `more` and read the same way. The pipeline's
section is not copied field by field: `pipeline_config()` puts its rows' values into `PipelineConfig`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import field, make_dataclass
from typing import TYPE_CHECKING, Any, Final, TypeVar, cast

from attrib_agent.attribution.forecast import ForecastSettings
from attrib_agent.config import pipeline_rows
from attrib_agent.config.setting import Setting
from attrib_agent.config.settings import SETTINGS
from attrib_agent.config.types import shown
from attrib_agent.pipeline import PipelineConfig

__all__ = ["AgentConfig"]
T = TypeVar("T")


class AgentConfigBase:
    """What every AgentConfig answers besides its settings: derived values, the sections' configs, the log."""

    origin: Mapping[str, str]  # where each value came from
    warnings: tuple[str, ...]  # what the agent should warn about once logging is set up
    more: Mapping[str, Any]  # settings registered after the class was made

    def __getattr__(self, name: str) -> Any:
        more = self.__dict__.get("more", {})
        if name in more:
            return more[name]
        raise AttributeError(f"AgentConfig has no setting {name!r}")

    def __getitem__(self, row: Setting[T]) -> T:
        """A row's value, typed as the row's parser returns it (`cfg[ROW]`)."""
        return cast(T, getattr(self, row.name))

    def names(self) -> list[str]:
        return [s.name for s in SETTINGS] + [n for n in self.more if n not in BUILT_IN]

    @property
    def metrics_url(self) -> str | None:
        """The URL the poller scrapes: vllm_url + /metrics (unless vllm_url already names it)."""
        url: str | None = self.vllm_url
        if url is None:
            return None
        return url if url.endswith("/metrics") else url + "/metrics"

    @property
    def log_from_start(self) -> bool:
        return bool(self.log_from == "start")

    @property
    def listen_host(self) -> str:
        """The bare host to bind (`::1`, no brackets), as uvicorn and socket.bind take it."""
        return str(self.listen.host)

    @property
    def listen_port(self) -> int:
        return int(self.listen.port)

    def reveal_api_token(self) -> str | None:
        """The token itself, for the API's comparison only: never log or print it."""
        return self.api_token.reveal() if self.api_token is not None else None

    def pipeline_config(self) -> PipelineConfig:
        return pipeline_rows.pipeline_config(self._values())

    def forecast_settings(self) -> ForecastSettings:
        return pipeline_rows.forecast_settings(self._values())

    def _values(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in self.names()}

    def describe(self) -> list[tuple[str, str, str]]:
        """(setting, value, source) for every setting, secrets and URL passwords masked: the start-up log."""
        return [(n, shown(getattr(self, n)), self.origin.get(n, "default")) for n in self.names()]

    def __repr__(self) -> str:
        return "AgentConfig(" + ", ".join(f"{n}={shown(getattr(self, n))}" for n in self.names()) + ")"


BUILT_IN: Final = frozenset(s.name for s in SETTINGS)  # the settings made into fields
_NOT_A_SETTING = {"setting": False}

if TYPE_CHECKING:
    class AgentConfig(AgentConfigBase):
        """Every setting of `attrib-agent run` and `replay --serve`; see docs/configuration.md for each."""

        def __init__(self, *, origin: Mapping[str, str] = ..., warnings: tuple[str, ...] = (),
                     more: Mapping[str, Any] = ..., **settings: Any) -> None: ...
else:
    AgentConfig = make_dataclass(
        "AgentConfig",
        [*((s.name, Any, field(default=s.default)) for s in SETTINGS),
         ("origin", Mapping[str, str], field(default_factory=dict, compare=False, metadata=_NOT_A_SETTING)),
         ("warnings", tuple[str, ...], field(default=(), compare=False, metadata=_NOT_A_SETTING)),
         ("more", Mapping[str, Any], field(default_factory=dict, hash=False, metadata=_NOT_A_SETTING))],
        bases=(AgentConfigBase,), frozen=True, repr=False,
        namespace={"__module__": __name__,
                   "__doc__": "Every setting of `attrib-agent run` and `replay --serve`; see docs/configuration.md."})
