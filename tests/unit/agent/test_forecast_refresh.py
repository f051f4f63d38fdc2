"""The agent's loop builds the forecast's snapshot after each settle, so the first POST /v1/forecast after a
settle finds it built: the request costs its own candidate's run only (and a failing forecast is tried once a
settle, not once a batch)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import httpx
import pytest

from attrib_agent.agent.core import AgentCore
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import RequestReceived
from attrib_agent.sources.replay import ReplaySource

WHALE2 = Path(__file__).resolve().parents[2] / "fixtures" / "recordings" / "whale2"


def test_the_loop_builds_each_settles_snapshot_before_the_request_asks() -> None:
    core = AgentCore.from_config(AgentConfig(), live=False)
    events = list(ReplaySource(WHALE2).events())
    cut = next(i for i, ev in enumerate(events) if isinstance(ev, RequestReceived) and "-w2-" in ev.request_id)

    async def main() -> tuple[int, int, int, dict[str, object]]:
        stop = asyncio.Event()
        consumer = asyncio.create_task(core.consume(stop))
        core.submit_many(events[:cut])
        for _ in range(200):  # until the consumer has drained the queue
            await asyncio.sleep(0.01)
            if core.pipeline.last_event_ts == events[cut - 1].ts:
                break
        await asyncio.sleep(0.05)
        settles, built = core.pipeline.settles, core.state.forecasts.built
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=core.asgi_app(None)),
                                     base_url="http://agent") as client:
            r = await client.post("/v1/forecast", json={"prompt_tokens": 3000, "max_tokens": 100})
        after = core.state.forecasts.built
        stop.set()
        await consumer
        return settles, built, after, r.json()

    settles, before, after, body = asyncio.run(main())
    assert settles > 1 and before >= 1
    assert after == before  # the request found this settle's snapshot built by the loop
    forecasts = body["forecasts"]
    assert isinstance(forecasts, list) and forecasts[0]["candidate"]["prompt_tokens"] == 3000


def test_a_failing_forecast_is_tried_once_per_settle(monkeypatch: pytest.MonkeyPatch) -> None:
    core = AgentCore.from_config(AgentConfig(), live=False)
    calls = 0

    def broken() -> None:
        nonlocal calls
        calls += 1
        raise RuntimeError("boom")

    monkeypatch.setattr(core.state, "refresh_reference", broken)
    core.refresh_forecast()
    assert calls == 0  # no event yet: nothing to forecast
    for ev in list(ReplaySource(WHALE2).events())[:50]:
        core.process(ev)
    core.refresh_forecast()
    core.refresh_forecast()
    assert calls == 1 and core.pipeline.settles >= 1
