"""The one shape of a live source, and how a source registers itself (node_exporter's `registerCollector`).

A source turns its input into typed events and hands each to `emit`; it never raises into the agent
(I/O trouble is counted in its health). The agent runs every registered source alike: `run(emit, stop)`
as a task, waits for `started` (listeners bound; a source that cannot start ends `run` with the error),
and after `stop` calls `aclose()`. Adding a source is one new module with a `SourceSpec` (carrying the rows
of its settings) plus one line in `sources/registry.py`; its settings then have flags, ATTRIB_* variables
and TOML keys like every other.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from attrib_agent.config.setting import Setting
from attrib_agent.events import Event
from attrib_agent.health import SourceHealth

if TYPE_CHECKING:  # the settings are read at build time only; no import of the config layer at run time
    from attrib_agent.config.load import AgentConfig

Emit = Callable[[Event], None]
RecordParse = Callable[[Mapping[str, Any], float], Sequence[Event]]
"""One recorded record (`recording.py`'s line for the source's stream) and its receipt time -> its events; a bad
record is counted in the source's health and yields none, never raises."""


class Source(Protocol):
    """What the agent loops over: a name, `run(emit, stop)` until stop, `aclose()` after."""

    name: str
    started: asyncio.Event  # set once the source is up (ports bound); the agent reports ready after

    async def run(self, emit: Emit, stop: asyncio.Event) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True)
class SourceContext:
    """What the agent lends a source when building it: its health records and the clock."""

    health: Callable[[str], SourceHealth]  # the named health record, created on first use
    clock: Callable[[], float]
    adopt_health: Callable[[SourceHealth], None]  # for a source that keeps its own record (by its name)


@dataclass(frozen=True)
class ReplayContext:
    """What a replay lends a source's record parser: the stream's health record and the agent's settings it reads."""

    health: SourceHealth
    engine: int = 0
    max_otlp_decompressed: int = 64 * 1024 * 1024


@dataclass(frozen=True)
class SourceSpec:
    """A source's registration: its name, the rows of the settings it reads (gathered into
    `config.settings.SETTINGS`), and how to build it from the settings (None: not configured, stays off)."""

    name: str
    settings: tuple[Setting[Any], ...]
    build: Callable[[AgentConfig, SourceContext], Source | None]
    stream: str | None = None  # the recording stream (`recording.STREAMS`) a replay reads in its place
    # How a replay parses that stream's records: the live source's own parse, so replay runs the live code.
    parser: Callable[[ReplayContext], RecordParse] | None = None


def _malformed(_: Exception) -> str:
    return "malformed"


def checked_record_parse(parse: RecordParse, health: SourceHealth, *, bad_record: tuple[type[Exception], ...],
                         bad_input: tuple[type[Exception], ...] = (), reason: Callable[[Exception], str] = _malformed,
                         count_success: bool = True) -> RecordParse:
    """A stream's record parser as every replayed source runs it: input its live code rejects (`bad_input`) is
    counted under `reason(error)`, a record missing its fields (`bad_record`) as `malformed_record`; neither
    raises. `count_success`: count each good record in the health (off when `parse` counts, as the poller does)."""

    def checked(rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
        try:
            events = parse(rec, ts)
        except bad_input as e:
            health.skip(reason(e))
            return ()
        except bad_record:
            health.skip("malformed_record")
            return ()
        if count_success:
            health.success(ts)
        return events

    return checked


async def wait_for_stop(stop: asyncio.Event) -> None:
    """`run` of a source whose work happens in callbacks (receivers): up until stop."""
    await stop.wait()
