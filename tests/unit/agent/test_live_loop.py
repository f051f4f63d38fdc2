"""Live, the pipeline runs on its own thread: a slow settle never holds the event loop, so probes, stored-result
lookups and /metrics answer at once (the last body, while the next is built), and the backlog is on /metrics
and /readyz. Driven through the agent's real HTTP server."""

from __future__ import annotations

import asyncio
import time
from typing import Any

import httpx

from attrib_agent.agent.core import AgentCore, ServeOptions
from attrib_agent.pipeline import AttributionPipeline
from tests.unit.sinks.api_replayed import events

SLOW_SETTLE_S = 0.6


def series(text: str, name: str) -> float:
    return next(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name + " "))


def test_a_slow_settle_does_not_hold_the_loop() -> None:
    pipeline = AttributionPipeline()
    attributor = pipeline.attributor
    real_attribute = attributor.attribute

    def slow_attribute(*args: Any, **kwargs: Any) -> Any:
        time.sleep(SLOW_SETTLE_S)  # an expensive re-simulation, on the pipeline thread
        return real_attribute(*args, **kwargs)

    # the settle pass's attribution made slow (a compiled pipeline's own methods cannot be replaced)
    attributor.attribute = slow_attribute  # type: ignore[method-assign]
    core = AgentCore(pipeline, threaded=True)
    evs = events("shorts")

    async def main() -> dict[str, Any]:
        stop = asyncio.Event()
        ports: list[int] = []
        serving = asyncio.create_task(core.serve(ServeOptions("127.0.0.1", 0), stop, ports.append))
        consumer = asyncio.create_task(core.consume(stop))
        while not ports:
            await asyncio.sleep(0.01)
        out: dict[str, Any] = {"slowest": {}, "backlog_seen": 0.0, "readyz_backlog": 0}
        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{ports[0]}", trust_env=False,
                                     timeout=10.0) as client:
            first = await client.get("/metrics")  # the first body is built (nothing queued yet)
            assert first.status_code == 200
            core.submit_many(evs)
            until = time.monotonic() + 4 * SLOW_SETTLE_S
            while time.monotonic() < until:
                for path in ("/healthz", "/metrics", "/readyz"):
                    t0 = time.perf_counter()
                    r = await client.get(path)
                    took = time.perf_counter() - t0
                    out["slowest"][path] = max(out["slowest"].get(path, 0.0), took)
                    if path == "/metrics":
                        out["backlog_seen"] = max(out["backlog_seen"], series(r.text, "attrib_pipeline_backlog_events"))
                    if path == "/readyz":
                        out["readyz_backlog"] = max(out["readyz_backlog"], r.json()["pipeline"]["backlog_events"])
                await asyncio.sleep(0.02)
            out["settles"] = core.pipeline.settles
        stop.set()
        await consumer
        await serving
        core.shutdown()
        return out

    out = asyncio.run(main())
    assert out["settles"] >= 2  # the slow settles ran while the requests were answered
    for path, took in out["slowest"].items():
        assert took < SLOW_SETTLE_S / 3, f"{path} waited {took:.3f} s behind a settle"
    assert out["backlog_seen"] > 0 and out["readyz_backlog"] > 0  # the queue behind the slow settles, shown


def test_a_full_queue_drops_and_counts() -> None:
    core = AgentCore(AttributionPipeline(), max_queued=10)
    core.submit_many(events("shorts")[:25])
    assert core.backlog().events == 10
    assert core.state.health["pipeline"].skipped["queue_full"] == 15
