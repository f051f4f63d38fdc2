"""The `attrib-agent` command line: `main` is the console script; `agent.py` holds run/replay/explain, `lab.py`
the lab's subcommands, `report.py` the tables and JSON they print."""

from attrib_agent.cli.main import build_parser, main

__all__ = ["build_parser", "main"]
