"""Requests that ended without a result (aborted, skipped) in the journal: written, read back bounded, bad records
counted; and the pipeline's two maps of them bounded by max_pending."""

from __future__ import annotations

from pathlib import Path

from attrib_agent.events import RequestAborted
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.sinks.journal import ResultJournal


def test_ended_records_round_trip_the_last_per_id_and_bounded(tmp_path: Path) -> None:
    j = ResultJournal(tmp_path)
    j.append_ended([("a", "aborted"), ("b", "skipped"), ("c", "aborted"), ("a", "skipped")])
    j.close()
    results, ended = ResultJournal(tmp_path).load_all(max_ended=2)
    assert results == [] and ended == [("c", "aborted"), ("a", "skipped")]  # the last two ids, oldest first


def test_a_bad_ended_record_is_counted_not_read(tmp_path: Path) -> None:
    j = ResultJournal(tmp_path)
    j.append_ended([("a", "aborted")])
    j.close()
    seg = sorted(tmp_path.glob("results-*.ndjson"))[-1]
    with seg.open("a") as f:
        f.write('{"request_id": "b", "ended": "finished"}\n{"request_id": 7, "ended": "aborted"}\n')
    again = ResultJournal(tmp_path)
    assert again.load_all(max_ended=10)[1] == [("a", "aborted")]
    assert again.errors["malformed"] == 2


def test_the_pipelines_ended_maps_are_bounded() -> None:
    p = AttributionPipeline(PipelineConfig(max_pending=3))
    for i in range(10):
        p.feed(RequestAborted(float(i), None, f"r{i}"))
        p.restore_ended(f"old{i}", "skipped")
    assert p.take_ended() == [("r7", "aborted"), ("r8", "aborted"), ("r9", "aborted")]
    assert p.take_ended() == []
    assert [p.settled_status(f"old{i}") for i in (6, 7, 9)] == [None, "skipped", "skipped"]
