"""The wall clock stepping back an hour mid-run (NTP, a VM restored): done in-process, with the live agent's
clock injected (a subprocess's clock cannot be stepped without root tricks). vLLM shares the host's clock, so
the run after the step carries times an hour earlier too. The agent keeps serving, attributes the requests
after the step, and neither the result store's age bound nor the journal's drops or revives results wrongly."""

from __future__ import annotations

import argparse
import asyncio
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from attrib_agent.agent.live import LiveAgent
from attrib_agent.config.load import add_run_arguments, load_config

from .harness import AgentProcess, Feed, LogWriter, StandInVllm, recorded, same_result, wait_until

STEP_S = 3600.0


class SteppedClock:
    def __init__(self) -> None:
        self.offset_s = 0.0

    def __call__(self) -> float:
        return time.time() + self.offset_s


class InProcessAgent(AgentProcess):
    """A LiveAgent on its own event loop in a thread, reached over HTTP like the process (AgentProcess' API)."""

    def launch(self, clock: SteppedClock) -> None:
        parser = argparse.ArgumentParser()
        add_run_arguments(parser)
        args = parser.parse_args([a for a in self.args()[2:]])
        self.live = LiveAgent(load_config(args, {}), clock=clock)
        self._ready = threading.Event()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None

        async def main() -> None:
            self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
            await self.live.run(self._stop, lambda a: self._ready.set())

        self._thread = threading.Thread(target=asyncio.run, args=(main(),), name="live-agent", daemon=True)
        self._thread.start()
        assert self._ready.wait(30), "the in-process agent did not start"

    @property
    def alive(self) -> bool:
        return self._thread.is_alive()

    def stop(self) -> int | None:
        if self._loop is not None and self._stop is not None and self._thread.is_alive():
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)
        assert not self._thread.is_alive(), "the in-process agent did not stop"
        return 0


@pytest.fixture
def in_process(tmp_path: Path, stand_in: StandInVllm, log_writer: LogWriter) -> Iterator[InProcessAgent]:
    agent = InProcessAgent(tmp_path / "agent", stand_in.url, log_writer.path, journal_dir=tmp_path / "journal")
    yield agent
    if hasattr(agent, "_thread"):
        agent.stop()


@pytest.mark.timeout(180)
def test_clock_stepping_back_an_hour_keeps_attributing_and_loses_no_result(
        in_process: InProcessAgent, stand_in: StandInVllm, log_writer: LogWriter, tmp_path: Path) -> None:
    clock = SteppedClock()
    agent = in_process
    agent.launch(clock)
    first, second = recorded("canary"), recorded("shorts")
    stand_in.play(first)
    Feed(first, log_writer, stand_in, agent.otlp_url).start().join(60)
    before = agent.wait_final(first.span_ids)

    clock.offset_s = -STEP_S  # the host's clock steps back an hour: the agent's receipt times and vLLM's own
    feed = Feed(second, log_writer, stand_in, agent.otlp_url, time_shift_s=-STEP_S).start()
    feed.join(60)
    after = agent.wait_final(second.span_ids)
    assert all(r["finished_ts"] < time.time() - STEP_S + 60 for r in after.values())  # in the stepped-back time
    assert agent.healthy()
    m = agent.metrics()
    assert m.value("attrib_results_evicted_total") == 0
    assert m.value("attrib_results_stored") == len(first.span_ids) + len(second.span_ids)
    assert m.value("attrib_requests_attributed_total") == len(first.span_ids) + len(second.span_ids)
    kept = agent.finals(first.span_ids)
    assert set(kept) == set(before) and all(same_result(before[r], kept[r]) for r in before)
    # the top window counts back from the (stepped-back) present: the run after the step, all of it
    top = agent.get("/v1/culprits/top", window="30m").json()
    assert top["results"] == len(second.span_ids)
    agent.stop()

    # Restarted on the stepped clock: the journal serves both runs again, no more and no fewer.
    again = InProcessAgent(tmp_path / "agent2", stand_in.url, log_writer.path, journal_dir=tmp_path / "journal")
    again.launch(clock)
    try:
        served = again.finals([*first.span_ids, *second.span_ids])
        assert set(served) == {*first.span_ids, *second.span_ids}
        assert all(same_result(after[r], served[r]) for r in second.span_ids)
        assert all(same_result(before[r], served[r]) for r in first.span_ids)
        wait_until(lambda: again.healthy(), 10, "the restarted agent to answer")
    finally:
        again.stop()
