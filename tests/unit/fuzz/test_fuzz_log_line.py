"""Fuzz vLLM's log line parser: 10,000 mutated real lines (every line of the canary and preempt recordings is a
seed), none raises, and each is counted: an event (ok_total) or a skip by kind."""

from __future__ import annotations

from typing import Any

from attrib_agent.recording import LOG, Recording

from .mutate import CASES, Mutator, Tally


def _parser() -> Any:
    """The one import of the parser under test (its module path may move)."""
    from attrib_agent import health
    from attrib_agent.sources.log import parser as log_parser

    return log_parser.LogLineParser, health.SourceHealth


def test_fuzz_log_lines(fixtures_dir: Any) -> None:
    parser_cls, health_cls = _parser()
    lines = sorted({r["line"] for name in ("canary", "preempt")
                    for r in Recording(fixtures_dir / "recordings" / name).records(LOG)})
    mut, tally = Mutator([x.encode() for x in lines], seed=1302), Tally("log lines")
    health = health_cls("log")
    parser = parser_cls(health)
    for i in range(CASES):
        line = mut.text(max_ops=3)
        before = health.ok_total + sum(health.skipped.values())
        events = parser.parse_all(line, 1_795_307_359.0 + i * 0.01)
        assert health.ok_total + sum(health.skipped.values()) > before, line  # counted, one way or the other
        tally.add("event" if events else "skipped")
    assert "parser_error" not in health.skipped and not health.errors
    tally.report()
    print("skips by kind:", dict(health.skipped))
