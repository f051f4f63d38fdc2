"""A `--speed` replay that cannot keep its pace still yields to the loop, so `replay --serve` answers /readyz while
it runs (before, a replay behind schedule never awaited: neither the API nor the collector freezer ran until it
ended), and its results are those of a replay as fast as possible."""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import httpx

from attrib_agent.agent.core import AgentCore, ServeOptions
from attrib_agent.agent.replay import replay_into
from attrib_agent.cli.report import json_lines
from attrib_agent.config.load import AgentConfig

BENCH_MIXED = Path(__file__).parents[2] / "fixtures" / "recordings" / "bench-mixed"  # ~3,100 events, ~1 s of CPU


def _results(core: AgentCore) -> list[str]:
    return list(json_lines(sorted(core.pipeline.store, key=lambda r: (r.finished_ts, r.request_id))))


def test_readyz_answers_during_a_replay_behind_its_pace_and_the_results_do_not_change() -> None:
    core = AgentCore.from_config(AgentConfig(), live=False)
    answered: list[tuple[float, float, int]] = []  # (monotonic time sent, time answered, status)
    done = threading.Event()

    def probe(port: int) -> None:
        """GET /readyz in a loop from another thread, as a probe would."""
        with httpx.Client(trust_env=False, timeout=30) as c:
            while not done.is_set():
                sent = time.monotonic()
                resp = c.get(f"http://127.0.0.1:{port}/readyz")
                answered.append((sent, time.monotonic(), resp.status_code))

    async def main() -> tuple[float, float]:
        stop = asyncio.Event()
        ports: list[int] = []
        server = asyncio.create_task(core.serve(ServeOptions("127.0.0.1", 0), stop, ports.append))
        while not ports:
            await asyncio.sleep(0.01)
        prober = threading.Thread(target=probe, args=(ports[0],), daemon=True)
        prober.start()
        while not answered:  # the probe is up
            await asyncio.sleep(0.01)
        # 1e9 x recorded time: no event is ever on schedule, so the pacing itself never sleeps. A request sent
        # after `began` and answered before `ended` was answered while the replay ran: the loop runs nothing else
        # between taking these two times unless the replay yields to it.
        began = time.monotonic()
        n = await replay_into(core, BENCH_MIXED, speed=1e9)
        ended = time.monotonic()
        assert n > 2000
        done.set()
        await asyncio.to_thread(prober.join, 60)
        stop.set()
        await server
        return began, ended

    began, ended = asyncio.run(main())
    core.shutdown()
    during = [status for sent, got, status in answered if began < sent and got < ended]
    assert during and set(during) <= {200, 503}, answered[:5]

    fast = AgentCore.from_config(AgentConfig(), live=False)
    asyncio.run(replay_into(fast, BENCH_MIXED))
    fast.shutdown()
    assert _results(core) == _results(fast)
