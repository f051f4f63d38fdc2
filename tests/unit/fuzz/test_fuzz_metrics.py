"""Fuzz the /metrics text parser: 10,000 mutated real scrapes, each parsed or refused with MetricsParseError."""

from __future__ import annotations

from typing import Any

from attrib_agent.recording import METRICS, Recording

from .mutate import CASES, Mutator, Tally


def _parser() -> Any:
    """The one import of the parser under test (its module path may move)."""
    from attrib_agent.sources.metrics import parser as metrics_parser

    return metrics_parser


def test_fuzz_metrics_text(fixtures_dir: Any) -> None:
    mp = _parser()
    texts = [r["text"] for name in ("shorts", "preempt")
             for r in Recording(fixtures_dir / "recordings" / name).records(METRICS)]
    corpus = [t.encode() for t in texts[:: max(1, len(texts) // 40)]]
    # Whole scrapes are several KB; single series lines make more cases land on a line's edge cases.
    corpus += [line.encode() for line in texts[-1].splitlines() if line.startswith("vllm:")][:200]
    mut, tally = Mutator(corpus, seed=1301), Tally("metrics text")
    tracker = mp.CounterTracker()
    for _ in range(CASES):
        text = mut.text()
        try:
            snaps = mp.parse_metrics(text, 1.0)
        except mp.MetricsParseError as e:
            assert "\n" not in str(e)
            tally.add("typed_error")
            continue
        assert len({(s.engine, s.model_name) for s in snaps}) == len(snaps)
        tracker.observe(snaps)
        tally.add("parsed" if snaps else "empty")
    tally.report()
