"""The results journal on real files, fed the results of replayed real recordings."""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.journal import JournalError, ResultJournal
from attrib_agent.sinks.journal.segments import scan_segments

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def replay(name: str, whole_seconds: bool = False) -> tuple[AttributionPipeline, list[AttributionResult]]:
    from attrib_agent.sources.replay import ReplaySource
    from tests.unit.timeline.test_finalize_fresh import whole_second_stamps

    p = AttributionPipeline()
    out: list[AttributionResult] = []
    evs = ReplaySource(RECORDINGS / name).events()
    for ev in whole_second_stamps(evs) if whole_seconds else evs:
        out.extend(p.feed(ev))
    out.extend(p.settle())
    return p, out


@pytest.fixture(scope="module")
def preempt() -> tuple[AttributionPipeline, list[AttributionResult]]:
    return replay("preempt")


@pytest.fixture(scope="module")
def finals(preempt: tuple[AttributionPipeline, list[AttributionResult]]) -> list[AttributionResult]:
    return list(preempt[0].store)


def renamed(results: list[AttributionResult], tag: str) -> list[AttributionResult]:
    """The same real results under distinct ids, to make volume."""
    return [replace(r, request_id=f"{r.request_id}#{tag}") for r in results]


def disk_bytes(d: Path) -> int:
    return sum(s.size for s in scan_segments(d))


@pytest.mark.parametrize("name", ["preempt", "whale2"])
def test_round_trip_equals_the_pipelines_results(tmp_path: Path, name: str) -> None:
    p, out = replay(name, whole_seconds=True)  # 1 s log stamps: results wait their settle margin, partial first
    assert any(not r.final for r in out)  # partial results are journaled too, then superseded by the final one
    with ResultJournal(tmp_path) as j:
        for r in out:  # as the app does: whatever each feed returned, flushed now and then
            j.append([r])
            if r.final:
                j.flush()
        assert j.written_total == len(out) and j.pending == 0
    loaded = ResultJournal(tmp_path).load()
    assert loaded == list(p.store) and len(loaded) == len(p.store) > 10
    assert all(r.final for r in loaded)
    # what a restarted agent's store would keep: the newest, and none older than its age bound
    assert ResultJournal(tmp_path).load(max_results=5) == list(p.store)[-5:]
    cut = sorted(r.finished_ts for r in loaded)[len(loaded) // 2]
    assert ResultJournal(tmp_path).load(since_ts=cut) == [r for r in loaded if r.finished_ts >= cut]


def test_records_are_one_json_object_per_line_with_ids_counts_and_times_only(
        tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path)
    j.append(finals)
    assert j.flush() == len(finals)
    [seg] = j.segments()
    assert seg.name == "results-0000000001.ndjson"
    lines = seg.read_bytes().splitlines()
    assert [json.loads(x) for x in lines] == [json.loads(json.dumps(to_dict(r))) for r in finals]
    assert j.flush() == 0 and j.written_total == len(finals)


def test_segments_rotate_and_the_oldest_go_past_the_byte_bound(tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path, segment_bytes=8 * 1024, max_bytes=32 * 1024)
    written: list[str] = []
    for k in range(40):
        batch = renamed(finals, str(k))
        j.append(batch)
        j.flush()
        written += [r.request_id for r in batch]
        assert disk_bytes(tmp_path) <= 32 * 1024
        assert all(s.size <= 8 * 1024 for s in scan_segments(tmp_path))
    assert j.written_total == len(written) and j.deleted_segments_total > 0
    assert 4 <= len(j.segments()) <= 6 and j.segments() == [s.path for s in scan_segments(tmp_path)]
    ids = [r.request_id for r in ResultJournal(tmp_path).load()]
    # the newest survive, oldest first: at least the whole segments' worth under the bound (all but the one open)
    longest = max(len(json.dumps(to_dict(r), separators=(",", ":"))) + 1 for r in finals)
    assert ids == written[-len(ids):] and len(ids) >= (32 - 8) * 1024 // longest
    j.close()


def test_segments_past_max_age_are_deleted(tmp_path: Path, finals: list[AttributionResult]) -> None:
    now = [1000.0]
    j = ResultJournal(tmp_path, segment_bytes=4 * 1024, max_bytes=1024 * 1024, max_age_s=60, clock=lambda: now[0])
    j.append(renamed(finals, "old"))
    j.flush()
    *closed, still_open = j.segments()
    first_new = len(json.dumps(to_dict(renamed(finals, "new")[0]), separators=(",", ":"))) + 1
    fits = still_open.stat().st_size + first_new <= 4 * 1024
    now[0] += 120
    j.append(renamed(finals, "new"))
    j.flush()
    assert len(closed) > 1 and not set(closed) & set(j.segments())
    # written again if the new records began in it (so young again); else it aged out with the others
    assert (still_open in j.segments()) == fits
    tags = [r.request_id.split("#")[1] for r in j.load()]
    assert tags.count("new") == len(finals) and tags.count("old") < len(finals) // 2


def test_malformed_and_torn_lines_are_skipped_and_counted(tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path)
    j.append(finals)
    j.flush()
    j.close()
    [seg] = j.segments()
    data = seg.read_bytes()
    lines = data.splitlines(keepends=True)
    junk = [b"not json\n", b"[1, 2]\n", b'{"request_id": "x"}\n', b"\xff\xfe\n", b"\n"]
    for key, bad in (("prompt_tokens", float("inf")), ("sequences", 0)):  # JSON's Infinity into an int; no output
        junk.append(json.dumps(json.loads(lines[0]) | {key: bad}).encode() + b"\n")
    torn = lines[-1][: len(lines[-1]) // 2]  # the last record cut mid-write, as SIGKILL leaves it
    seg.write_bytes(b"".join(lines[:3] + junk + lines[3:-1]) + torn)
    again = ResultJournal(tmp_path)
    assert [r.request_id for r in again.load()] == [r.request_id for r in finals[:-1]]
    assert again.errors == {"malformed": len(junk), "truncated": 1}
    # the restarted journal writes a fresh segment: the torn line is never glued to a new record
    again.append(finals[-1:])
    again.flush()
    assert len(again.segments()) == 2 and again.load()[-1] == finals[-1]


def test_an_overlong_line_is_skipped(tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path, segment_bytes=2048, max_bytes=1 << 20)
    j.append(finals[:1])
    j.flush()
    with j.segments()[0].open("ab") as f:
        f.write(b"x" * (2048 + 1024 * 1024 + 10) + b"\n")
    j.append(finals[1:2])
    j.flush()
    assert [r.request_id for r in j.load()] == [finals[0].request_id, finals[1].request_id]
    assert j.errors == {"too_long": 1}


def test_unwritable_directory_is_a_clear_error_at_start(tmp_path: Path) -> None:
    a_file = tmp_path / "file"
    a_file.write_text("")
    with pytest.raises(JournalError, match="not usable"):
        ResultJournal(a_file / "journal")
    with pytest.raises(JournalError, match="not usable"):
        ResultJournal(a_file)
    with pytest.raises(JournalError, match="not usable"):
        ResultJournal(tmp_path / "bad\0name")
    with pytest.raises(ValueError):
        ResultJournal(tmp_path, max_bytes=0)


def test_a_small_byte_bound_gets_smaller_segments_and_restarts_leave_no_empty_files(
        tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path, max_bytes=64 * 1024)  # under the default 4 MiB segment
    assert j.segment_bytes == 16 * 1024
    j.close()
    for _ in range(3):
        ResultJournal(tmp_path).close()
    assert not list(tmp_path.iterdir())
    with ResultJournal(tmp_path, max_bytes=64 * 1024) as j:
        j.append(finals)
    # the small bound rotates (preempt's 23 results are ~35 KiB of JSON: 3 segments of 16 KiB)
    assert len(j.segments()) >= 2 and [r.request_id for r in j.load()] == [r.request_id for r in finals]


def test_disk_full_is_counted_retried_and_never_raised(tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path, segment_bytes=8 * 1024, max_bytes=1 << 20)
    first = renamed(finals, "a")
    j.append(first)
    assert j.flush() == len(first)
    # the next segment's name leads to /dev/full: the kernel answers every write with ENOSPC
    full_seq = max(int(p.name[8:18]) for p in j.segments()) + 1
    os.symlink("/dev/full", tmp_path / f"results-{full_seq:010d}.ndjson")
    second = renamed(finals, "b")
    j.append(second)
    before = j.flush()  # what still fitted in the open segment; then the rotation hit the full one
    assert before < len(second)
    assert j.errors == {"disk_full": 1} and j.pending == len(second) - before
    assert j.flush() == len(second) - before and j.pending == 0  # retried in a fresh segment
    assert not (tmp_path / f"results-{full_seq:010d}.ndjson").exists()  # the empty one is cleaned away
    assert [r.request_id for r in ResultJournal(tmp_path).load()] == [r.request_id for r in first + second]


def test_the_buffer_is_bounded_when_flushes_fail_to_come(tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path, max_buffer_bytes=16 * 1024)
    for k in range(20):
        j.append(renamed(finals, str(k)))
    kept = j.pending
    assert 0 < kept < 20 * len(finals) and j.errors["dropped"] == 20 * len(finals) - kept
    assert j.flush() == kept
    ids = [r.request_id for r in j.load()]
    assert ids[-1] == f"{finals[-1].request_id}#19" and len(ids) == kept  # the newest were kept


def test_a_result_that_is_not_json_is_counted(tmp_path: Path, finals: list[AttributionResult]) -> None:
    j = ResultJournal(tmp_path)
    j.append([replace(finals[0], quality=float("nan")), finals[1]])
    assert j.flush() == 1 and j.errors == {"encode": 1}
