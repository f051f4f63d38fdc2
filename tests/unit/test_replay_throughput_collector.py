"""benchmarks/replay_throughput.py runs the agent's freezer in its passes on their event time (`Collector`), and
leaves the collector as it is with `--no-gc-freeze`."""

from __future__ import annotations

import gc

from benchmarks.replay_throughput import Collector


def test_the_pass_freezes_its_survivors_every_second_of_event_time_and_unfreezes_at_its_end() -> None:
    c = Collector(True)
    try:
        assert c.freezer is not None and gc.get_freeze_count() > 0  # started before the pass, as the agent
        c.tick(1000.0)  # the pass's first event: its event time starts here
        kept = [[i] for i in range(20_000)]
        gc.collect(0)  # survivors of a young collection: what makes a pass due
        c.tick(1000.5)
        assert c.passes == 0  # within the second
        c.tick(1001.0)
        assert c.passes == 1 and c.freezer.frozen[-1] >= len(kept)
        assert "1 freezer passes" in c.end()
        assert gc.get_freeze_count() == 0
    finally:
        gc.unfreeze()


def test_no_gc_freeze_leaves_the_collector_as_it_is() -> None:
    c = Collector(False)
    for ts in (0.0, 5.0, 10.0):
        c.tick(ts)
    assert c.freezer is None and c.passes == 0 and gc.get_freeze_count() == 0
    assert c.end().endswith("full collections")
