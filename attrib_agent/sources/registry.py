"""Every live source the agent runs, one registration line each (in the order they start)."""

from __future__ import annotations

from typing import Final

from attrib_agent.sources.log import source as log
from attrib_agent.sources.metrics import source as metrics
from attrib_agent.sources.nvml import source as nvml
from attrib_agent.sources.otlp import source as otlp
from attrib_agent.sources.plugin import source as plugin
from attrib_agent.sources.source import SourceSpec

SOURCES: Final[tuple[SourceSpec, ...]] = (
    otlp.SPEC,
    metrics.SPEC,
    log.SPEC,
    nvml.SPEC,
    plugin.SPEC,
)
