"""The log parser's id memory (RequestIds): sized by the requests a line can still name, never losing one of them.

vLLM logs `Received request <external>`, then `Added request <external>-<8 hex>` (`<i>_<external>-<8 hex>` for
the i-th child of an n>1 request); an abort may name the internal id. No line marks a normal finish: the agent
tells the parser when a span lands (`span_landed`). Each test feeds real line shapes through `LogLineParser`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.replay import tell_spans_to_log
from attrib_agent.events import RequestAborted, RequestAdded, RequestSpan
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import LOG
from attrib_agent.sources.log.parser import (
    ADMIT_WINDOW_S,
    ENDED_GRACE_S,
    LogEvent,
    LogLineParser,
    RequestIds,
)
from attrib_agent.sources.log.source import LogRecordParser
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"
PREFIX = "(APIServer pid=7) INFO 11-22 00:29:19 [async_llm.py:1] "


def line(msg: str) -> str:
    return PREFIX + msg


def receive(parser: LogLineParser, rid: str, ts: float) -> None:
    parser.parse_all(line(f"Received request {rid}: params: SamplingParams(n=1, max_tokens=16), "
                          "lora_request: None."), ts)


def add(parser: LogLineParser, internal: str, ts: float) -> list[LogEvent]:
    return parser.parse_all(line(f"Added request {internal}."), ts)


def abort(parser: LogLineParser, internal: str, ts: float) -> list[LogEvent]:
    return parser.parse_all(line(f"Aborted request(s) {internal}."), ts)


def internal(rid: str, i: int = 0) -> str:
    return f"{rid}-{i:08x}"


def test_received_added_and_aborted_lines_parse_as_vllm_logs_them() -> None:
    parser = LogLineParser(SourceHealth("log"))
    receive(parser, "cmpl-a-0", 1.0)
    (added,) = add(parser, internal("cmpl-a-0"), 1.0)
    assert isinstance(added, RequestAdded)
    assert (added.request_id, added.internal_id) == ("cmpl-a-0", internal("cmpl-a-0"))
    (aborted,) = abort(parser, internal("cmpl-a-0"), 1.0)
    assert isinstance(aborted, RequestAborted) and aborted.request_id == "cmpl-a-0"
    assert parser.health.ok_total == 3 and not parser.health.skipped


def test_memory_follows_the_requests_in_flight_not_how_many_went_by() -> None:
    """10,000 requests, at most 50 in flight, each ending with its span: the ids held stay near what is in flight
    plus the grace's, where a count-bounded memory would hold them all."""
    parser = LogLineParser(SourceHealth("log"))
    held = []
    for n in range(10_000):
        ts = n * 0.1  # 10 a second: the grace (30 s) holds ~300 ended ones
        rid = f"cmpl-{n:06d}-0"
        receive(parser, rid, ts)
        add(parser, internal(rid, n), ts)
        if n >= 50:
            parser.span_landed(f"cmpl-{n - 50:06d}-0", ts)
        held.append(len(parser.ids))
    sizes = parser.ids.sizes()
    assert sizes["in_flight"] == 50 and sizes["received"] == 0
    assert sizes["ended"] <= ENDED_GRACE_S / 0.1 + 1
    assert max(held) <= 50 + ENDED_GRACE_S / 0.1 + 2


def test_a_request_in_flight_keeps_its_mapping_however_many_others_come_and_go() -> None:
    """A whale in flight while 20,000 shorts pass (more than every bound here): its abort by internal id still
    names it; so does an n>1 whale's child's, and an abort naming that parent names each child still in flight."""
    ids = RequestIds(limit=64, max_received=16, max_ended=16)
    parser = LogLineParser(SourceHealth("log"))
    parser.ids = ids
    receive(parser, "cmpl-whale-0", 0.0)
    add(parser, internal("cmpl-whale-0"), 0.0)
    receive(parser, "cmpl-par-0", 0.0)
    for i in range(3):  # vLLM's children share the parent's internal id: `<i>_<external>-<8 hex>`
        add(parser, f"{i}_" + internal("cmpl-par-0", 7), 0.0)
    for n in range(20_000):
        rid = f"cmpl-s{n}-0"
        receive(parser, rid, n * 0.01)
        add(parser, internal(rid, n), n * 0.01)
        parser.span_landed(rid, n * 0.01)
    assert len(ids) <= 1 + 3 + 16 and ids.parents() == 1
    events = abort(parser, internal("cmpl-whale-0"), 300.0) + abort(parser, "1_" + internal("cmpl-par-0", 7), 300.0)
    events += abort(parser, "cmpl-par-0", 300.0)
    assert [e.request_id for e in events if isinstance(e, RequestAborted)] == [
        "cmpl-whale-0", "1_cmpl-par-0", "0_cmpl-par-0", "2_cmpl-par-0"]
    assert ids.parents() == 0


def test_each_child_of_an_n_gt_1_request_is_its_own_request_and_each_span_ends_one() -> None:
    """vLLM 0.32 runs an n>1 request as n engine requests (parallel_sampling.py `get_child_info`: `<i>_<internal>`),
    each exporting its own span named by the parent's external id (output_processor.py `do_tracing`)."""
    parser = LogLineParser(SourceHealth("log"))
    receive(parser, "cmpl-p-0", 0.0)
    added = [e for i in range(3) for e in add(parser, f"{i}_" + internal("cmpl-p-0"), 0.01)]
    assert [(e.request_id, e.internal_id) for e in added if isinstance(e, RequestAdded)] == [
        (f"{i}_cmpl-p-0", f"{i}_" + internal("cmpl-p-0")) for i in range(3)]
    assert parser.ids.sizes() == {"received": 0, "in_flight": 3, "ended": 0} and parser.ids.parents() == 1
    for k in range(3):
        parser.span_landed("cmpl-p-0", 1.0 + k)
        assert parser.ids.sizes()["in_flight"] == 2 - k
    assert parser.ids.parents() == 0
    # an ordinary id that merely starts with digits and `_` is no child: no received parent names it
    (plain,) = add(parser, internal("7_job"), 2.0)
    assert isinstance(plain, RequestAdded) and plain.request_id == "7_job" and parser.ids.parents() == 0


def test_n_gt_1_parents_are_bounded() -> None:
    ids = RequestIds(limit=4, max_received=8, max_ended=2)
    for n in range(50):
        ids.received(f"p{n}", 0.0)
        ids.added(f"0_p{n}-{n:08x}")
    assert ids.parents() == 4 and ids.sizes()["in_flight"] == 4


def test_a_late_line_after_the_span_still_names_the_request_within_the_grace() -> None:
    parser = LogLineParser(SourceHealth("log"))
    receive(parser, "cmpl-a-0", 10.0)
    add(parser, internal("cmpl-a-0"), 10.0)
    parser.span_landed("cmpl-a-0", 11.0)
    (late,) = abort(parser, internal("cmpl-a-0"), 11.0 + ENDED_GRACE_S - 1)
    assert late.request_id == "cmpl-a-0"
    # the log read behind OTLP: the span first, then the request's own lines; it is never counted in flight
    parser.span_landed("cmpl-b-0", 12.0)
    receive(parser, "cmpl-b-0", 12.5)
    (added,) = add(parser, internal("cmpl-b-0"), 12.5)
    assert added.request_id == "cmpl-b-0" and parser.ids.sizes()["in_flight"] == 0
    # past the grace the id is forgotten: a line naming it then keeps the id vLLM logged (what an unknown id gets)
    receive(parser, "cmpl-c-0", 11.0 + ENDED_GRACE_S + 100)
    assert "cmpl-a-0" not in parser.ids._ended
    (gone,) = abort(parser, internal("cmpl-a-0"), 11.0 + ENDED_GRACE_S + 100)
    assert gone.request_id == internal("cmpl-a-0")


def test_an_abort_or_failure_line_ends_the_request() -> None:
    parser = LogLineParser(SourceHealth("log"))
    for rid in ("cmpl-a-0", "cmpl-b-0"):
        receive(parser, rid, 1.0)
        add(parser, internal(rid), 1.0)
    (a,) = abort(parser, internal("cmpl-a-0"), 2.0)
    (b,) = parser.parse_all(line("Request cmpl-b-0 failed (engine dead)."), 2.0)
    assert (a.request_id, b.request_id) == ("cmpl-a-0", "cmpl-b-0")
    assert parser.ids.sizes() == {"received": 0, "in_flight": 0, "ended": 2}


def test_ids_that_never_reach_the_engine_leave_after_the_admit_window_and_are_bounded() -> None:
    """/tokenize (and rejected) calls get `Received` and nothing after: forgotten after ADMIT_WINDOW_S of event
    time, and never more than `max_received` of them (a flood)."""
    parser = LogLineParser(SourceHealth("log"))
    parser.ids = RequestIds(max_received=100)
    for n in range(1_000):
        receive(parser, f"tokenize-{n:016x}", 1.0)
    assert parser.ids.sizes()["received"] == 100
    receive(parser, "cmpl-late-0", 1.0 + ADMIT_WINDOW_S + 1)
    assert parser.ids.sizes()["received"] == 1
    (added,) = add(parser, internal("cmpl-late-0"), 1.0 + ADMIT_WINDOW_S + 1)
    assert added.request_id == "cmpl-late-0" and parser.ids.sizes()["received"] == 0


def test_after_a_vllm_restart_the_new_servers_ids_map_and_the_old_ones_are_bounded() -> None:
    """Requests in flight when vLLM restarts never get a span: they stay held until the hard bound pushes them
    out, oldest first, while the new server's requests (the same external ids reused) map as before."""
    parser = LogLineParser(SourceHealth("log"))
    parser.ids = RequestIds(limit=8)
    for n in range(20):  # the old server: 20 in flight, none finishes
        receive(parser, f"cmpl-{n}-0", 1.0)
        add(parser, internal(f"cmpl-{n}-0", 1), 1.0)
    assert parser.ids.sizes()["in_flight"] == 8
    for n in range(3):  # the new server, the same ids, new suffixes
        receive(parser, f"cmpl-{n}-0", 100.0)
        (added,) = add(parser, internal(f"cmpl-{n}-0", 2), 100.0)
        assert added.request_id == f"cmpl-{n}-0"
        (aborted,) = abort(parser, internal(f"cmpl-{n}-0", 2), 100.0)
        assert aborted.request_id == f"cmpl-{n}-0"
    assert len(parser.ids) <= 8 + 3


@pytest.mark.parametrize("name", ["shorts", "preempt", "whale2", "bench-mixed", "bench-prefix", "nseq-steps"])
def test_on_real_recordings_every_request_leaves_the_in_flight_memory(name: str) -> None:
    """Replayed as the agent replays (the log parser told of each span): every added request ended by a span or
    an abort, so none is left in flight, and every event is the one the parser gave before (the same ids)."""
    path = RECORDINGS / name
    if not path.is_dir():
        pytest.skip(f"{name} recording not present")
    plain = list(ReplaySource(path).events())
    source = ReplaySource(path)
    core = AgentCore(AttributionPipeline())
    tell_spans_to_log(core, source)
    told = []
    for ev in source.events():
        if type(ev) is RequestSpan:
            core.span_arrived(ev)
        told.append(ev)
    assert told == plain
    log = source.parsers[LOG]
    assert isinstance(log, LogRecordParser)
    ids = log.line_parser.ids
    added = {e.request_id for e in plain if isinstance(e, RequestAdded)}
    assert added and ids.sizes()["in_flight"] == 0 and ids.parents() == 0  # n>1: each child ended by a span
    assert not set(ids._received) & added  # only calls that never reached the engine wait there
    assert 0 < ids.sizes()["ended"] <= sum(isinstance(e, RequestSpan | RequestAborted) for e in plain)


def test_each_map_has_a_hard_bound() -> None:
    ids = RequestIds(limit=4, max_received=3, max_ended=2)
    for n in range(50):
        ids.received(f"r{n}", 0.0)
        ids.added(f"a{n}-{n:08x}")
        ids.ended(f"e{n}", 0.0)
    assert ids.sizes() == {"received": 3, "in_flight": 4, "ended": 2}
