"""One setting as data (a row): name, file section, parser, default, help; what a source or sink registers.

A row is declared beside the component that reads it (a source's module, a sink's, the pipeline's config
rows in `config/pipeline_rows.py`), and `config.settings` gathers them into the one table that drives the
flags, the environment names, the TOML keys, validation and `describe()`. A row whose `target` names a field
of a config dataclass takes its default from that field, so the default lives once.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Final, Generic, TypeVar

from attrib_agent.config.types import shown

ENV_PREFIX: Final = "ATTRIB_"
T = TypeVar("T")
C = TypeVar("C")


@dataclass(frozen=True)
class Setting(Generic[T]):
    name: str
    section: str  # the TOML table it may sit in (`[vllm]`)
    parse: Callable[[object], T]
    default: T
    help: str
    metavar: str = "VALUE"
    boolean: bool = False  # a --x/--no-x flag
    live: bool = False  # read by `run` only (the sources); `replay --serve` has no flag for it
    flag: bool = True  # False for secrets: a flag's value shows in `ps`
    file: bool = True  # False for secrets: config files end up in ConfigMaps and repositories
    default_text: str | None = None  # how the default reads in help and docs, when not its value
    target: str | None = None  # dotted field of the config dataclass this row builds (`attribution.whale_factor`)

    @property
    def shown_default(self) -> str:
        return self.default_text if self.default_text is not None else shown(self.default)

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    @property
    def flag_name(self) -> str:
        return "--" + self.name.replace("_", "-")


def field_of(obj: object, path: str) -> Any:
    """The value at a dotted field path (`slo.ttft_s`) of a (nested) dataclass instance."""
    for part in path.split("."):
        obj = getattr(obj, part)
    return obj


def field_setting(root: object, name: str, target: str, section: str, parse: Callable[[object], Any], help: str,
                  metavar: str = "VALUE", **kw: Any) -> Setting[Any]:
    """A row that sets `target` of the dataclass `root` is a default instance of; its default is read from it."""
    return Setting(name, section, parse, field_of(root, target), help, metavar, target=target, **kw)


def build(root: C, rows: Iterable[Setting[Any]], values: Mapping[str, Any]) -> C:
    """`root` (a default config dataclass) with every row's value put at the row's `target` field."""
    return _replace(root, {s.target: values[s.name] for s in rows if s.target is not None})


def _replace(obj: C, changes: Mapping[str, Any]) -> C:
    direct = {k: v for k, v in changes.items() if "." not in k}
    nested: dict[str, dict[str, Any]] = {}
    for path, value in changes.items():
        if "." in path:
            head, rest = path.split(".", 1)
            nested.setdefault(head, {})[rest] = value
    direct.update((head, _replace(getattr(obj, head), sub)) for head, sub in nested.items())
    return dataclasses.replace(obj, **direct)  # type: ignore[type-var]
