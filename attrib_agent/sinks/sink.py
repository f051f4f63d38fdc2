"""The one shape of a result sink, and the multi-sink the agent hands every batch to.

Like OpenTelemetry's `SpanProcessor`: `on_results` takes each batch the pipeline settled (partial and final;
a sink picks what it wants) and must be cheap, `flush` pushes out what is buffered (the agent calls it every
half second and at the end), `shutdown` flushes and releases. `MultiSink` fans out in registration order
and keeps one failing sink from reaching the others (SynchronousMultiSpanProcessor). Adding a sink is one
module with a `SinkSpec` (carrying the rows of its settings) plus one line in `sinks/registry.py`.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config.setting import Setting

if TYPE_CHECKING:
    from attrib_agent.config.load import AgentConfig
    from attrib_agent.read_model import AgentState

logger = logging.getLogger("attrib_agent")


class Sink(Protocol):
    name: str

    def on_results(self, results: Sequence[AttributionResult]) -> None: ...

    def flush(self) -> None: ...

    def shutdown(self) -> None: ...


@dataclass(frozen=True)
class SinkSpec:
    """A sink's registration: name, the rows of the settings it reads, whether a replay runs it too, and how to
    build it (None: not configured)."""

    name: str
    settings: tuple[Setting[Any], ...]
    build: Callable[[AgentConfig, AgentState], Sink | None]
    in_replay: bool = True


class MultiSink:
    """Every sink, one call each; a sink's exception is logged and counted (`errors[name]`), never raised."""

    name = "sinks"

    def __init__(self, sinks: Sequence[Sink] = (), on_error: Callable[[str], None] | None = None) -> None:
        self.sinks = list(sinks)
        self._on_error = on_error

    def get(self, name: str) -> Sink | None:
        return next((s for s in self.sinks if s.name == name), None)

    def on_results(self, results: Sequence[AttributionResult]) -> None:
        for s in self.sinks:
            self._call(s, "on_results", lambda s=s: s.on_results(results))  # type: ignore[misc]

    def flush(self) -> None:
        for s in self.sinks:
            self._call(s, "flush", s.flush)

    def shutdown(self) -> None:
        for s in self.sinks:
            self._call(s, "shutdown", s.shutdown)

    def _call(self, sink: Sink, what: str, fn: Callable[[], None]) -> None:
        try:
            fn()
        except Exception:  # a sink bug must not stop the agent or the other sinks
            logger.exception("%s sink failed in %s; skipped", sink.name, what)
            if self._on_error is not None:
                self._on_error(sink.name)
