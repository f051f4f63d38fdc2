"""Write the dashboards' JSON: `python -m dashboards.build` (or `--check` to fail when the committed JSON drifted).

The JSON in `dashboards/json/` is what operators import (and what the Helm chart ships as ConfigMaps), so it
is committed; the code here is its source of truth.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any, Final

from dashboards import agent_health, interference

JSON_DIR: Final = Path(__file__).parent / "json"
DASHBOARDS: Final[dict[str, Callable[[], dict[str, Any]]]] = {
    "attrib-interference.json": interference.build,
    "attrib-agent-health.json": agent_health.build,
}


def render() -> dict[str, str]:
    """File name -> JSON text, stable (sorted keys, fixed indent) so a diff shows only real changes."""
    return {name: json.dumps(build(), indent=2, sort_keys=True, ensure_ascii=False) + "\n"
            for name, build in DASHBOARDS.items()}


def drifted(json_dir: Path = JSON_DIR) -> list[str]:
    """Files whose committed text differs from what the code generates (missing files included)."""
    out = []
    for name, text in render().items():
        path = json_dir / name
        if not path.is_file() or path.read_text(encoding="utf-8") != text:
            out.append(name)
    return out


def write(json_dir: Path = JSON_DIR) -> list[Path]:
    json_dir.mkdir(parents=True, exist_ok=True)
    paths = []
    for name, text in render().items():
        path = json_dir / name
        path.write_text(text, encoding="utf-8")
        paths.append(path)
    return paths


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m dashboards.build", description=__doc__)
    p.add_argument("--check", action="store_true", help="exit 1 if the committed JSON differs from the code")
    args = p.parse_args(argv)
    if args.check:
        stale = drifted()
        for name in stale:
            print(f"{JSON_DIR / name} is out of date: run python -m dashboards.build", file=sys.stderr)
        return 1 if stale else 0
    for path in write():
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
