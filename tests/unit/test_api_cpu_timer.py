"""api_load's in-server CPU per request (benchmarks/_api_cpu.py): a request is charged its own steps only, not
what the loop ran while it waited (a read on the pipeline thread), and is filed under api_load's endpoint name."""

from __future__ import annotations

import asyncio
import time
from typing import Any

from benchmarks._api_cpu import CpuTimer, endpoint


def _spin(s: float) -> None:
    end = time.thread_time() + s
    while time.thread_time() < end:
        pass


def test_a_request_is_charged_its_own_steps_not_the_loop_while_it_waits() -> None:
    async def app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        _spin(0.01)  # its own work
        await asyncio.sleep(0.05)  # waiting: the other request's 40 ms run here
        await send({"type": "http.response.start", "status": 404 if "unknown" in scope["path"] else 200})
        await send({"type": "http.response.body", "body": b""})

    async def busy() -> None:
        await asyncio.sleep(0.01)
        _spin(0.04)

    async def send(msg: Any) -> None:
        return None

    timer = CpuTimer(app)

    async def main() -> None:
        scope = {"type": "http", "path": "/v1/requests/cmpl-unknown-1-0/culprits"}
        await asyncio.gather(timer(scope, None, send), busy())
        await timer({"type": "http", "path": "/metrics"}, None, send)

    try:
        asyncio.run(main())
    finally:
        timer.close()
    [charged] = timer.cpu["culprits_unknown"]
    assert 0.009 <= charged < 0.03  # its 10 ms, not the 40 ms spun while it slept
    assert len(timer.cpu["metrics"]) == 1 and set(timer.summary()) == {"culprits_unknown", "metrics"}


def test_endpoint_names_are_api_loads() -> None:
    assert endpoint("/v1/requests/x/culprits", 200) == "culprits"
    assert endpoint("/v1/timeline", 200) == "timeline" and endpoint("/v1/culprits/top", 200) == "top_5m"
