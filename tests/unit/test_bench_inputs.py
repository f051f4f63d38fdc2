"""What the benchmarks build from the committed recordings is well-formed: the time-shifted concatenation
(every stream readable and in time order, request/trace/span ids unique per copy and consistent across
streams, bodies unchanged but for times and ids) and the memory benchmark's copied results and arrivals."""

from __future__ import annotations

import base64
import re
from collections import Counter
from collections.abc import Iterator
from itertools import islice
from pathlib import Path

import pytest

from attrib_agent.attribution.result_codec import to_dict
from attrib_agent.events import EngineStep, Event, RequestAdded, RequestReceived, RequestSpan
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import LOG, METRICS, OTLP, Recording
from attrib_agent.sources.replay import ReplaySource
from benchmarks._recordings import (
    INPUT_STREAMS,
    BuildInfo,
    CopyRewrite,
    EndlessRecording,
    SourceRecording,
    build_concatenated,
    copy_plan,
    copy_tag,
    load_sources,
    plan_copies,
)
from benchmarks.memory import active_stream, copied_result, real_results

_STAMP = re.compile(r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d")


@pytest.fixture(scope="module")
def sources() -> list[SourceRecording]:
    return load_sources()


@pytest.fixture(scope="module")
def built(sources: list[SourceRecording], tmp_path_factory: pytest.TempPathFactory) -> BuildInfo:
    """Two rounds over every recording and one copy more: 11 copies, ~7,000 events."""
    one_round = sum(s.events for s in sources)
    return build_concatenated(tmp_path_factory.mktemp("concat"), sources, min_events=2 * one_round + 1)


@pytest.fixture(scope="module")
def events(built: BuildInfo) -> list[Event]:
    return list(ReplaySource(built.path).events())


def _copies(built: BuildInfo, sources: list[SourceRecording]) -> Iterator[tuple[int, SourceRecording, int]]:
    for copy, (i, shift) in enumerate(plan_copies(sources, built.events, 5.0)):
        yield copy, sources[i], shift


def test_every_stream_reads_back_whole_and_in_time_order(built: BuildInfo, sources: list[SourceRecording]) -> None:
    assert built.copies == 2 * len(sources) + 1
    rec = Recording(built.path)
    for stream in INPUT_STREAMS:
        stamps = [r["ts"] for r in rec.records(stream)]
        expected = sum(len(src.records[stream]) for _, src, _ in _copies(built, sources))
        assert len(stamps) == expected == built.records[stream]
        assert rec.stats[stream].skipped == 0
        assert stamps == sorted(stamps), f"{stream} goes back in time"
    starts = [src.first_ts + shift for _, src, shift in _copies(built, sources)]
    ends = [src.last_ts + shift for _, src, shift in _copies(built, sources)]
    assert all(nxt >= end + 5.0 for end, nxt in zip(ends, starts[1:], strict=False)), "copies overlap"


def test_replay_yields_each_copy_s_events_and_skips_nothing_new(built: BuildInfo, events: list[Event],
                                                                 sources: list[SourceRecording]) -> None:
    want: Counter[str] = Counter()
    skipped_src: Counter[str] = Counter()
    for _, src, _ in _copies(built, sources):
        rs = ReplaySource(src.path)
        want.update(type(e).__name__ for e in rs.events())
        skipped_src.update({f"{k}:{kind}": n for k, h in rs.health.items() for kind, n in h.skipped.items()})
    assert len(events) == built.events == want.total()
    assert Counter(type(e).__name__ for e in events) == want
    rs = ReplaySource(built.path)
    for _ in rs.events():
        pass
    skipped = Counter({f"{k}:{kind}": n for k, h in rs.health.items() for kind, n in h.skipped.items()})
    assert skipped == skipped_src  # only what the recordings' own lines skip (unknown and content lines)
    assert all(not h.errors for h in rs.health.values())


def test_request_ids_are_unique_per_copy_and_consistent_across_streams(events: list[Event],
                                                                        built: BuildInfo) -> None:
    received = [e.request_id for e in events if isinstance(e, RequestReceived)]
    added = {e.request_id for e in events if isinstance(e, RequestAdded)}
    spans = [e for e in events if isinstance(e, RequestSpan)]
    assert len(received) == len(set(received))
    assert added == set(received)
    assert {s.request_id for s in spans} == set(received)  # each copy's span names its own copy's request
    assert len({s.trace_id for s in spans}) == len({s.span_id for s in spans}) == len(spans)
    tags = {rid.split("-")[1] for rid in received}
    assert len(tags) == built.copies


def test_times_move_together_in_log_lines_spans_and_receipt(built: BuildInfo, events: list[Event],
                                                            sources: list[SourceRecording]) -> None:
    """A copy is its source moved by a whole number of seconds: receipt times, log stamps, span times."""
    moved_by_id = {(type(e), e.request_id): e for e in events if isinstance(e, RequestSpan | RequestReceived)}
    for copy, src, shift in _copies(built, sources):
        for e in ReplaySource(src.path).events():
            if not isinstance(e, RequestSpan | RequestReceived):
                continue
            moved = moved_by_id[(type(e), e.request_id.replace(f"-{src.tag}-", f"-{copy_tag(src.tag, copy)}-"))]
            assert moved.ts - e.ts == pytest.approx(shift, abs=1e-6)
            if isinstance(e, RequestSpan) and isinstance(moved, RequestSpan):
                assert moved.start_ts - e.start_ts == pytest.approx(shift, abs=1e-6)
                assert moved.end_ts - e.end_ts == pytest.approx(shift, abs=1e-6)
                assert (moved.ttft_s, moved.prompt_tokens, moved.completion_tokens) == \
                    (e.ttft_s, e.prompt_tokens, e.completion_tokens)
            elif isinstance(e, RequestReceived) and isinstance(moved, RequestReceived):
                assert e.log_ts is not None and moved.log_ts is not None
                assert moved.log_ts - e.log_ts == pytest.approx(shift, abs=1e-6)
    lines = list(Recording(built.path).records(LOG))
    offset = 0
    for copy, src, _ in _copies(built, sources):
        old, new = f"-{src.tag}-", f"-{copy_tag(src.tag, copy)}-"
        for orig, moved in zip(src.records[LOG], lines[offset:offset + len(src.records[LOG])], strict=True):
            # the line is the recorded one but for its stamp and the copy's tag
            assert _STAMP.sub("T", moved["line"], count=1) == _STAMP.sub("T", orig["line"], count=1).replace(old, new)
        offset += len(src.records[LOG])


def test_metrics_bodies_are_copied_verbatim(built: BuildInfo, sources: list[SourceRecording]) -> None:
    texts = [r["text"] for r in Recording(built.path).records(METRICS)]
    assert texts == [r["text"] for _, src, _ in _copies(built, sources) for r in src.records[METRICS]]


def test_otlp_bodies_re_encode_byte_for_byte_when_nothing_moves(sources: list[SourceRecording]) -> None:
    for src in sources:
        same = CopyRewrite(src.tag, 0, 0, new_tag=src.tag)  # copy 0 keeps its trace ids; no shift
        for rec in src.records[OTLP]:
            body = base64.b64decode(rec["body_b64"])
            assert same.otlp_body(body) == body
            assert same.otlp_record(rec) == rec


def test_the_endless_recording_is_the_built_one_without_end(built: BuildInfo, sources: list[SourceRecording]) -> None:
    endless = EndlessRecording(sources)
    for stream in (METRICS, LOG, OTLP):
        n = built.records[stream]
        assert list(islice(endless.records(stream), n)) == list(Recording(built.path).records(stream))
    assert list(endless.records("nvml")) == []  # no source has NVML: ends at once instead of spinning


def test_the_concatenation_attributes_every_request_once(events: list[Event], sources: list[SourceRecording]
                                                         ) -> None:
    first_round = events[:sum(s.events for s in sources) + sources[0].events]  # six copies, a restart between
    p = AttributionPipeline()
    for ev in first_round:
        p.feed(ev)
    p.settle()
    spans = [e.request_id for e in first_round if isinstance(e, RequestSpan)]
    finals = [r.request_id for r in p.store if r.final]
    assert sorted(finals) == sorted(spans)
    assert p.vllm_restarts >= 1  # counters go back at a copy boundary, as after a restart
    # iteration numbers restart with vLLM: the cost model still learns every step once, after each restart too
    assert p.attributor.cost.steps_seen == sum(isinstance(e, EngineStep) for e in first_round)


def test_plans_and_tags_are_bounded_and_refuse_clearly(sources: list[SourceRecording], tmp_path: Path) -> None:
    plan = plan_copies(sources, 1, 5.0)
    assert plan == [(0, 0)]
    assert [i for i, _ in islice(copy_plan(sources, 5.0), 7)] == [0, 1, 2, 3, 4, 0, 1]
    assert copy_tag("a11e94", 255) == "0000ff"
    with pytest.raises(ValueError, match="does not fit"):
        copy_tag("ab", 256)
    (tmp_path / "precious.txt").write_text("not a build")
    with pytest.raises(ValueError, match="refusing to overwrite"):
        build_concatenated(tmp_path, sources, min_events=1)
    assert (tmp_path / "precious.txt").exists()


def test_copied_results_keep_values_and_get_their_copy_s_ids(sources: list[SourceRecording]) -> None:
    base = real_results(sources)
    number = {s.tag: 10 + i for i, s in enumerate(sources)}  # one copy of each recording
    ids: dict[str, str] = {}
    copies = [copied_result(tag, r, number[tag], ids) for tag, r in base]
    assert len({r.request_id for r in copies}) == len(copies)
    for (tag, r), c in zip(base, copies, strict=True):
        new = copy_tag(tag, number[tag])
        assert c.request_id == r.request_id.replace(f"-{tag}-", f"-{new}-")
        assert [x.request_id for x in c.culprits] == [x.request_id.replace(f"-{tag}-", f"-{new}-")
                                                       for x in r.culprits]
        assert c.trace_id != r.trace_id and c.trace_id is not None and len(c.trace_id) == 32
        d, e = to_dict(c), to_dict(r)
        for key in ("request_id", "trace_id", "span_id", "finished_ts", "culprits"):
            d.pop(key), e.pop(key)
        assert d == e
    shared = {id(x.request_id) for c in copies for x in c.culprits} & {id(c.request_id) for c in copies}
    assert shared  # a culprit's id is the same string as its own result's, as in the pipeline


def test_active_stream_opens_n_requests_and_finishes_none(sources: list[SourceRecording]) -> None:
    stream = active_stream(sources, 300, rate=50.0)
    received = [e.request_id for e in stream if isinstance(e, RequestReceived)]
    assert len(received) == len(set(received)) == 300
    assert not any(isinstance(e, RequestSpan) for e in stream)
    stamps = [e.ts for e in stream]
    assert stamps == sorted(stamps)
    p = AttributionPipeline()
    for ev in stream:
        p.feed(ev)
    assert p.timeline.sizes()["requests"] == 300
