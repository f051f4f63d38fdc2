"""Every result sink the agent feeds, one registration line each (called in this order)."""

from __future__ import annotations

from typing import Final

from attrib_agent.sinks.journal import sink as journal
from attrib_agent.sinks.otel import sink as otel
from attrib_agent.sinks.sink import SinkSpec

SINKS: Final[tuple[SinkSpec, ...]] = (
    journal.SPEC,
    otel.SPEC,
)
