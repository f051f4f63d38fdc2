"""The TOML config file: keys are setting names, at the top level or in their own section table.

One scheme, so a key reads the same everywhere: `metrics_interval_s = 0.5` may sit at the top or under
`[vllm]` (its section), never under another table; the environment name is the same key upper-cased
with `ATTRIB_`, the flag the same key in kebab-case. Unknown keys and tables are errors (with a
did-you-mean), so a typo never silently leaves a default in place.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Final

from attrib_agent.config.setting import Setting
from attrib_agent.config.settings import sections
from attrib_agent.config.types import ConfigError
from attrib_agent.config.values import did_you_mean

MAX_FILE_BYTES: Final = 1024 * 1024  # a config file is a few KB; more is the wrong file


def read_config_file(path: Path, settings: Sequence[Setting[Any]]) -> dict[str, tuple[object, str]]:
    """Setting name -> (raw TOML value, source label such as `file agent.toml [vllm]`)."""
    label = f"file {path}"
    by_name = {s.name: s for s in settings}
    tables = sections(tuple(settings))
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
    except OSError as e:
        raise ConfigError(f"config file {path}: cannot read it: {e.strerror or type(e).__name__}") from None
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError(f"config file {path}: larger than {MAX_FILE_BYTES} bytes; is it the right file?")
    try:
        doc = tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"config file {path}: not UTF-8 text") from None
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"config file {path}: not valid TOML: {e}") from None

    out: dict[str, tuple[object, str]] = {}

    def take(key: str, value: object, section: str | None) -> None:
        where = f"{label} [{section}]" if section else label
        setting = by_name.get(key)
        if setting is None:
            raise ConfigError(f"{key} ({where}): unknown setting{did_you_mean(key, by_name)}")
        if not setting.file:
            raise ConfigError(f"{key} ({where}): not accepted in a config file (it would be stored in the clear); "
                              f"set {setting.env} or {key}_file")
        if section is not None and section != setting.section:
            raise ConfigError(f"{key} ({where}): belongs in [{setting.section}] or at the top level")
        if key in out:
            raise ConfigError(f"{key} ({where}): also set in {out[key][1]}; keep one")
        out[key] = (value, where)

    for key, value in doc.items():
        if not isinstance(value, dict):
            take(key, value, None)
            continue
        if key not in tables:
            hint = did_you_mean(key, tables) or f" (tables: {', '.join(tables)})"
            raise ConfigError(f"[{key}] ({label}): unknown table{hint}")
        for sub, subvalue in value.items():
            if isinstance(subvalue, dict):
                raise ConfigError(f"[{key}.{sub}] ({label}): tables do not nest; put {sub}'s keys in [{key}]")
            take(sub, subvalue, key)
    return out

