"""`kv_latest` (what a scrape reads) equals the whole ledger's last step reconciliation, the holdings in force
then and its last sample reconciliation, at every 25th event of the real recordings (live feeding)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import EngineTimeline

RECORDINGS = Path(__file__).resolve().parents[2] / "fixtures" / "recordings"


@pytest.mark.parametrize("name", ["whale2", "preempt", "shorts"])
def test_latest_figures_equal_the_full_ledgers(name: str) -> None:
    tl = EngineTimeline()
    checked = 0
    for n, ev in enumerate(ReplaySource(RECORDINGS / name).events()):
        tl.feed(ev)
        if n % 25:
            continue
        latest, ledger = tl.kv_latest(), tl.ledger
        steps, recs = ledger.step_reconciliations(), ledger.reconciliations()
        assert latest.step == (steps[-1] if steps else None)
        assert latest.sample == (recs[-1] if recs else None)
        assert latest.held == (ledger.held_at(steps[-1].ts) if steps else {})
        checked += latest.step is not None and latest.sample is not None
    assert checked > 10
