"""Fuzz the results journal's reader: 10,000 segments of mutated real journal lines (torn, flipped, spliced,
over-long, wrong types), each read through `ResultJournal.load`. Every line is either a result or counted
(malformed, truncated, too_long); nothing raises."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from .mutate import CASES, Mutator, Tally


def _journal() -> Any:
    """The one import of the code under test (its module path may move)."""
    from attrib_agent.sinks.journal import result_journal, segments

    return result_journal.ResultJournal, segments.segment_path


def _real_lines(tmp: Path) -> list[bytes]:
    from attrib_agent.pipeline import AttributionPipeline
    from attrib_agent.sources.replay import ReplaySource

    journal_cls, _ = _journal()
    p = AttributionPipeline()
    results = []
    for ev in ReplaySource(Path(__file__).parents[2] / "fixtures" / "recordings" / "whale1").events():
        results.extend(p.feed(ev))
    results.extend(p.settle())
    with journal_cls(tmp) as j:
        j.append(results)
        j.flush()
    return [line + b"\n" for seg in sorted(tmp.iterdir()) for line in seg.read_bytes().splitlines()]


def test_fuzz_journal_reader(tmp_path: Path) -> None:
    journal_cls, segment_path = _journal()
    lines = _real_lines(tmp_path / "source")
    assert len(lines) >= 20
    mut, rng, tally = Mutator(lines, seed=1305), random.Random(1305), Tally("journal reader")
    work = tmp_path / "journal"
    work.mkdir()
    seg = segment_path(work, 1)
    journal = journal_cls(work, segment_bytes=1)  # the longest line read: segment_bytes + 1 MiB
    total_lines = results = 0
    for _ in range(CASES):
        body = b"".join(mut.one(max_ops=2) if rng.random() < 0.7 else rng.choice(lines)
                        for _ in range(rng.randint(1, 5)))
        if rng.random() < 0.02:
            body = (b"x" * (1 << 20) + rng.choice(lines)) * 2  # lines over the reader's 1 MiB + segment limit
        seg.write_bytes(body)
        n_lines = body.count(b"\n") + (0 if body.endswith(b"\n") or not body else 1)
        before = sum(journal.errors.values())
        loaded = journal.load()
        counted = sum(journal.errors.values()) - before
        assert all(isinstance(r.request_id, str) for r in loaded)
        assert len(loaded) + counted <= n_lines  # a result or a count per line (ids repeat: last one kept)
        assert counted or loaded or not n_lines
        results += len(loaded)
        total_lines += n_lines
        tally.add("some_results" if loaded else "all_skipped")
    journal.close()
    tally.report()
    print(f"{total_lines:,} lines, {results:,} results, counted {dict(journal.errors)}")
