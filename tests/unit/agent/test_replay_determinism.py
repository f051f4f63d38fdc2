"""A replay settles on event time only: the wall-clock idle settle, which a busy machine fires at a different
event each run, must not change what `attrib-agent replay` reports (bench-mixed gave different digests)."""

from __future__ import annotations

import asyncio
import hashlib
from pathlib import Path

import pytest

from attrib_agent.agent import core as core_module
from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.replay import replay_into
from attrib_agent.cli.report import json_lines
from attrib_agent.config.load import AgentConfig

BENCH_MIXED = Path(__file__).parents[2] / "fixtures" / "recordings" / "bench-mixed"


def _digest(with_consumer: bool) -> tuple[str, int]:
    """The CLI's digest of a replay; `with_consumer`: the core's consumer runs beside it, as in `cmd_replay`."""
    core = AgentCore.from_config(AgentConfig(), live=False)

    async def main() -> None:
        stop = asyncio.Event()
        consume = asyncio.create_task(core.consume(stop)) if with_consumer else None
        await replay_into(core, BENCH_MIXED)
        stop.set()
        if consume is not None:
            await consume

    asyncio.run(main())
    results = sorted(core.pipeline.store, key=lambda r: (r.finished_ts, r.request_id))
    h = hashlib.sha256()
    for line in json_lines(results):
        h.update(line.encode() + b"\n")
    return h.hexdigest(), len(results)


def test_bench_mixed_replays_to_one_digest_with_the_idle_settle_firing_all_the_time(monkeypatch) -> None:
    plain, n = _digest(with_consumer=False)
    settles = 0
    settle = AgentCore.settle

    def counting(self: AgentCore) -> list:
        nonlocal settles
        settles += 1
        return settle(self)

    # The idle path forced: the consumer's wait times out at every yield of the replay (every 256 events), as it
    # does now and then when a loaded machine slows the replay between two events.
    monkeypatch.setattr(core_module, "IDLE_SETTLE_S", 1e-6)
    monkeypatch.setattr(AgentCore, "settle", counting)
    forced, m = _digest(with_consumer=True)
    assert n > 100 and m == n
    assert forced == plain
    assert settles <= 2  # replay_into's final settle and the consumer's at stop: none on the wall clock


@pytest.mark.parametrize("settle_when_idle", [True, False])
def test_the_live_consumer_still_settles_when_nothing_arrives(settle_when_idle: bool, monkeypatch) -> None:
    """Live (vLLM down, no events) the idle settle still runs; only a replay turns it off."""
    core = AgentCore.from_config(AgentConfig(), live=True)
    core.settle_when_idle = settle_when_idle
    calls = 0

    def counting(self: AgentCore) -> list:
        nonlocal calls
        calls += 1
        return []

    monkeypatch.setattr(core_module, "IDLE_SETTLE_S", 0.01)
    monkeypatch.setattr(AgentCore, "settle", counting)

    async def main() -> None:
        stop = asyncio.Event()
        task = asyncio.create_task(core.consume(stop))
        # the consumer's first step is the core's first garbage-collector pass (gc_freeze.py), a full collection
        # of the whole process: in a long test session that alone can take longer than a fixed 0.2 s wait, so
        # idle settles are awaited up to a deadline, and their absence judged 0.2 s after that pass
        loop = asyncio.get_running_loop()
        deadline = loop.time() + 10.0
        while core.freezer.pauses_s == [] and loop.time() < deadline:
            await asyncio.sleep(0.01)
        settled_by = loop.time() + 0.2
        while loop.time() < (deadline if settle_when_idle else settled_by) and not (settle_when_idle and calls > 2):
            await asyncio.sleep(0.01)
        stop.set()
        await task

    asyncio.run(main())
    assert (calls > 2) if settle_when_idle else (calls == 1)  # 1: the settle at stop
