"""`attrib-agent replay`: a recording played through the same core and sinks as live events would arrive."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Callable
from typing import Final

from attrib_agent.agent.core import AgentCore
from attrib_agent.events import Event, RequestSpan
from attrib_agent.health import SourceHealth
from attrib_agent.sources import registry as source_registry
from attrib_agent.sources.replay import ReplaySource

# Each recorded stream reports under its live source's name, so dashboards read a replay alike.
REPLAY_SOURCE_NAMES: Final = {spec.stream: spec.name for spec in source_registry.SOURCES if spec.stream is not None}
# Events fed between two yields to the loop (the API, the consumer's flushes and collector freezer), paced or not:
# a `--speed` replay behind its pace never sleeps, so without them it would hold the loop until it ended.
YIELD_EVERY: Final = 256


def tell_spans_to_log(core: AgentCore, source: ReplaySource) -> None:
    """The recording's log parser learns of each span as the live one does (`AgentCore.hear_spans`: one rule)."""
    core.hear_spans(source.parsers.values())


async def replay_into(core: AgentCore, path: str | os.PathLike[str], *, speed: float | None = None,
                      progress: Callable[[int], None] | None = None, exact: bool = False) -> int:
    """Play a recording through the core exactly as live events would arrive (same pipeline, same sinks).
    `exact`: with the step plugin's stream, as an agent in exact mode would have read it."""
    source = ReplaySource(path, exact=exact, engine=core.pipeline.config.engine)
    for stream, h in source.health.items():  # the live sources' names, so dashboards read a replay alike
        core.state.health[REPLAY_SOURCE_NAMES.get(stream, stream)] = h
    core.state.health["replay"] = SourceHealth("replay")
    core.state.replay_done = False
    core.settle_when_idle = False  # event time only: the same results however busy the machine is
    core.threaded = False  # fed here, on the loop: the API reads it here too
    heard = len(core.span_seen)
    tell_spans_to_log(core, source)
    n = 0

    async def emit(ev: Event) -> None:
        nonlocal n
        if type(ev) is RequestSpan:
            core.span_arrived(ev)
        core.process(ev)
        n += 1
        if progress is not None and n % 1000 == 0:
            progress(n)
        if n % YIELD_EVERY == 0:
            await asyncio.sleep(0)  # results depend on event time only, not on what the loop runs meanwhile

    try:
        await source.play(emit, speed=speed)
    finally:  # no span reaches the recording's parser after its replay: a core replayed into again holds none
        del core.span_seen[heard:]
    core.settle()
    core.flush()
    core.state.health["replay"].success(core.state.clock())
    core.state.replay_done = True
    return n
