"""The step plugin's messages into typed events: ids mapped to the frontend's, hostile datagrams skipped with a
reason, the live source counting them and never stopping."""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from pathlib import Path

import pytest

from attrib_agent.events import Event, SchedulerHello, SchedulerStep
from attrib_agent.health import SourceHealth
from attrib_agent.sources.plugin.parse import (
    MAX_DATAGRAM,
    PluginParseError,
    PluginSkip,
    parse_datagram,
    parse_message,
)
from attrib_agent.sources.plugin.source import PluginSource

STEP = {"v": 1, "kind": "step", "t": 100.5, "step": 3, "iter": 2, "tokens": 197,
        "scheduled": [{"id": "cmpl-a-0-897e827f", "new": 1, "done": 2048},
                      {"id": "chatcmpl-b-a238663d", "new": 196, "done": 0, "hit": 128}],
        "admitted": ["chatcmpl-b-a238663d"], "resumed": [], "preempted": ["cmpl-c-0-0123abcd"], "finished": [],
        "running": 2, "waiting": 1, "blocks": {"cmpl-a-0-897e827f": 17, "chatcmpl-b-a238663d": 2},
        "free_blocks": 60, "total_blocks": 96,
        "head": {"id": "cmpl-c-0-0123abcd", "reason": "preemption", "tokens": 900, "need_blocks": 8,
                 "preemptions": 1}, "drops": 4, "cost_us": 50}


def test_a_step_becomes_a_scheduler_step_with_external_ids() -> None:
    ev = parse_datagram(json.dumps(STEP).encode(), ts=101.0)
    assert isinstance(ev, SchedulerStep)
    assert (ev.ts, ev.sched_ts, ev.iteration, ev.tokens, ev.drops) == (101.0, 100.5, 2, 197, 4)
    assert [(s.request_id, s.new_tokens, s.done_tokens, s.cached_tokens) for s in ev.scheduled] == [
        ("cmpl-a-0", 1, 2048, None), ("chatcmpl-b", 196, 0, 128)]
    assert ev.admitted == ("chatcmpl-b",) and ev.preempted == ("cmpl-c-0",)
    assert dict(ev.blocks) == {"cmpl-a-0": 17, "chatcmpl-b": 2}
    assert ev.head is not None and (ev.head.request_id, ev.head.reason, ev.head.need_blocks) == \
        ("cmpl-c-0", "preemption", 8)


def test_hello_and_idle_steps() -> None:
    hello = parse_message({"v": 1, "kind": "hello", "t": 1.0, "block_size": 16, "total_blocks": 512,
                           "max_num_seqs": 256, "token_budget": 8192}, ts=2.0)
    assert hello == SchedulerHello(2.0, 0, 16, 512, 256, 8192)
    gone = parse_message({**STEP, "scheduled": [{"id": "cmpl-a-0-897e827f", "new": 1, "done": None}]}, ts=2.0)
    assert isinstance(gone, SchedulerStep) and gone.scheduled[0].done_tokens is None  # the plugin's "unknown"
    idle = parse_message({**STEP, "iter": None, "tokens": 0, "scheduled": []}, ts=2.0)
    assert isinstance(idle, SchedulerStep) and idle.iteration is None


@pytest.mark.parametrize("msg, skip", [({**STEP, "v": 2}, "version"), ({**STEP, "kind": "goodbye"}, "kind")])
def test_newer_versions_and_unknown_kinds_are_skipped(msg: dict[str, object], skip: str) -> None:
    with pytest.raises(PluginSkip) as e:
        parse_message(msg, ts=0.0)
    assert e.value.reason == skip


@pytest.mark.parametrize("data, reason", [
    (b"", "not_json"),
    (b"\xff\xfe{", "not_json"),
    (b"[1, 2]", "not_object"),
    (b"{\"v\": true}", "no_version"),
    (b"[" * 100_000 + b"]" * 100_000, "not_json"),  # nesting bomb
    (b" " * (MAX_DATAGRAM + 1), "too_large"),
    (json.dumps({**STEP, "iter": "2"}).encode(), "bad_field"),
    (json.dumps({**STEP, "tokens": -1}).encode(), "bad_field"),
    (json.dumps({**STEP, "t": "NaN"}).encode(), "bad_field"),
    (json.dumps({**STEP, "scheduled": [{"id": 7, "new": 1, "done": 0}]}).encode(), "bad_id"),
    (json.dumps({**STEP, "scheduled": ["x"]}).encode(), "bad_field"),
    (json.dumps({**STEP, "blocks": {"cmpl-a-0-897e827f": True}}).encode(), "bad_field"),
    (json.dumps({**STEP, "blocks": [1]}).encode(), "bad_field"),
    (json.dumps({**STEP, "preempted": ["x" * 600]}).encode(), "bad_id"),
    (json.dumps({**STEP, "admitted": ["a"] * 20_000}).encode(), "bad_field"),
    (json.dumps({**STEP, "head": "cmpl-c"}).encode(), "bad_field"),
])
def test_hostile_datagrams_raise_a_typed_error(data: bytes, reason: str) -> None:
    with pytest.raises(PluginParseError) as e:
        parse_datagram(data, ts=0.0)
    assert e.value.reason == reason


@pytest.mark.timeout(30)
def test_the_source_binds_reads_counts_bad_datagrams_and_cleans_up(tmp_path: Path) -> None:
    path = tmp_path / "plugin.sock"
    path.touch()  # a regular file in the way is never removed
    health = SourceHealth("vllm_plugin")
    with pytest.raises(OSError, match="not a socket"):
        asyncio.run(PluginSource(path, health, clock=lambda: 5.0).run(lambda ev: None, asyncio.Event()))
    path.unlink()
    got: list[Event] = []

    async def main() -> None:
        src = PluginSource(path, health, clock=lambda: 5.0)
        stop = asyncio.Event()
        task = asyncio.create_task(src.run(got.append, stop))
        await asyncio.wait_for(src.started.wait(), 5)
        tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        tx.connect(str(path))
        for data in (json.dumps(STEP).encode(), b"garbage", json.dumps({**STEP, "v": 9}).encode(),
                     json.dumps({**STEP, "iter": 3}).encode()):
            tx.send(data)
        tx.close()
        for _ in range(100):
            if len(got) == 2:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task
        await src.aclose()

    asyncio.run(main())
    assert [ev.iteration for ev in got if isinstance(ev, SchedulerStep)] == [2, 3]
    assert health.ok_total == 2 and health.skipped == {"not_json": 1, "version": 1}
    assert not path.exists()


def _busy(seconds: float) -> None:
    """Hold the GIL in pure Python, as a settle does (time.sleep would release it)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        sum(range(200))


def test_a_busy_event_loop_loses_no_datagram(tmp_path: Path) -> None:
    # The kernel queues ~10 datagrams per unix receiver (net.unix.max_dgram_qlen); a sender that never waits (the
    # plugin's worst case) sends 150 over ~0.75 s while the loop is busy for 1 s: a loop-driven reader drops most.
    path = tmp_path / "steps.sock"
    health = SourceHealth("vllm_plugin")
    got: list[Event] = []
    refused = 0

    def send_all() -> None:
        nonlocal refused
        tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        tx.connect(str(path))
        tx.setblocking(False)
        for i in range(150):
            try:
                tx.send(json.dumps({**STEP, "iter": i}).encode())
            except BlockingIOError:
                refused += 1
            time.sleep(0.005)
        tx.close()

    async def main() -> None:
        src = PluginSource(path, health, clock=time.time)
        stop = asyncio.Event()
        task = asyncio.create_task(src.run(got.append, stop))
        await asyncio.wait_for(src.started.wait(), 5)
        sender = threading.Thread(target=send_all)
        sender.start()
        _busy(1.0)  # the loop is stuck; only the reader thread can empty the socket
        await asyncio.to_thread(sender.join)
        for _ in range(200):
            if len(got) + refused >= 150:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task
        await src.aclose()

    asyncio.run(main())
    assert refused == 0
    assert [ev.iteration for ev in got if isinstance(ev, SchedulerStep)] == list(range(150))


def test_the_backlog_is_bounded_and_counts_what_it_could_not_hold(tmp_path: Path) -> None:
    path = tmp_path / "steps.sock"
    health = SourceHealth("vllm_plugin")
    got: list[Event] = []
    one = len(json.dumps({**STEP, "iter": 0}).encode())

    async def main() -> None:
        src = PluginSource(path, health, clock=time.time, max_backlog_bytes=3 * one + 10)
        stop = asyncio.Event()
        task = asyncio.create_task(src.run(got.append, stop))
        await asyncio.wait_for(src.started.wait(), 5)
        tx = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        tx.connect(str(path))
        for i in range(8):
            tx.send(json.dumps({**STEP, "iter": i}).encode())
        tx.close()
        _busy(0.5)  # nothing drains while the reader fills the backlog
        for _ in range(100):
            if len(got) + health.skipped["backlog_full"] >= 8:
                break
            await asyncio.sleep(0.01)
        stop.set()
        await task
        await src.aclose()
        assert src.overflowed == 5

    asyncio.run(main())
    assert [ev.iteration for ev in got if isinstance(ev, SchedulerStep)] == [0, 1, 2]
    assert health.skipped["backlog_full"] == 5 and health.ok_total == 3
