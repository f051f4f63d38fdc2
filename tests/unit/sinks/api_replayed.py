"""Agent states replayed from the committed recordings, and a one-call HTTP client for the API tests.

Replays are cached per recording: the tests only read the pipelines they share.
"""

from __future__ import annotations

import asyncio
from functools import cache
from pathlib import Path
from typing import Any

import httpx
from starlette.types import ASGIApp

from attrib_agent.events import Event
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.read_model import AgentState
from attrib_agent.sources.replay import ReplaySource
from tests.unit.timeline.test_finalize_fresh import whole_second_stamps

RECORDINGS = Path(__file__).resolve().parents[2] / "fixtures" / "recordings"


@cache
def events(name: str) -> tuple[Event, ...]:
    return tuple(ReplaySource(RECORDINGS / name).events())


@cache
def replayed(name: str) -> AttributionPipeline:
    """The whole recording fed and settled: every finished request has its final result."""
    p = AttributionPipeline()
    p.feed_all(events(name))
    p.settle()
    return p


@cache
def midway(name: str) -> AttributionPipeline:
    """Fed up to the first moment a slowed victim's result is partial while other requests still run (as live,
    mid-burst, with vLLM's default 1 s log stamps: it waits for its own `settle_margin_s`, or for an overlapping
    request's span or prefill; with millisecond stamps it is final at once on these recordings)."""
    p = AttributionPipeline()
    for ev in whole_second_stamps(events(name)):
        p.feed(ev)
        if any(not r.final and r.culprits for r in p.store) and any(
                p.status(lc.request_id) == "running" for lc in p.timeline.lifecycles()):
            return p
    raise AssertionError(f"{name}: no moment with a partial result and a running request")


def state_of(pipeline: AttributionPipeline, **kwargs: Any) -> AgentState:
    """A replay-mode state (the `replay` source present, replay finished) unless kwargs say otherwise."""
    kwargs.setdefault("health", {"replay": SourceHealth("replay")})
    return AgentState(pipeline=pipeline, **kwargs)


def call(app: ASGIApp, path: str, *, method: str = "GET", headers: dict[str, str] | None = None,
         raise_app_exceptions: bool = True) -> httpx.Response:
    async def go() -> httpx.Response:
        transport = httpx.ASGITransport(app=app, raise_app_exceptions=raise_app_exceptions)
        async with httpx.AsyncClient(transport=transport, base_url="http://agent") as client:
            return await client.request(method, path, headers=headers)

    return asyncio.run(go())
