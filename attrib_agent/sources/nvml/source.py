"""The GPU source: NVML samples when a driver is there; without one it says why once and stays off."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence
from dataclasses import fields
from typing import TYPE_CHECKING, Any, Final

from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting
from attrib_agent.events import Event, GpuSample
from attrib_agent.recording import NVML
from attrib_agent.sources.nvml.sampler import DEFAULT_INTERVAL_S, NvmlSampler
from attrib_agent.sources.source import (
    Emit,
    RecordParse,
    ReplayContext,
    SourceContext,
    SourceSpec,
    checked_record_parse,
)

if TYPE_CHECKING:
    from attrib_agent.config.load import AgentConfig

logger = logging.getLogger("attrib_agent")
NAME = "nvml"
ROWS: Final[tuple[Setting[Any], ...]] = (
    Setting("nvml", "nvml", v.parse_bool, True, "sample GPU memory and utilisation through NVML (reports "
            "`unavailable` once where there is no GPU)", boolean=True, live=True),
    Setting("nvml_interval_s", "nvml", v.seconds(0.1), DEFAULT_INTERVAL_S, "seconds between GPU samples", "SECONDS",
            live=True),
)


class NvmlSource:
    name = NAME

    def __init__(self, sampler: NvmlSampler) -> None:
        self.sampler = sampler
        self.started = asyncio.Event()

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        self.started.set()
        if not self.sampler.start():
            logger.warning("NVML unavailable (%s); GPU samples off", self.sampler.unavailable_reason)
            return
        await self.sampler.run(emit, stop)

    async def aclose(self) -> None:
        self.sampler.close()


def build(cfg: AgentConfig, ctx: SourceContext) -> NvmlSource | None:
    if not cfg.nvml:
        return None
    sampler = NvmlSampler(interval_s=cfg.nvml_interval_s, clock=ctx.clock)
    ctx.adopt_health(sampler.health)
    return NvmlSource(sampler)


_GPU_FIELDS: Final = frozenset(f.name for f in fields(GpuSample))


def record_parser(ctx: ReplayContext) -> RecordParse:
    """A recorded sample: the sampler's own `GpuSample`, stored field by field (`recording.nvml_record`)."""

    def parse(rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
        return (GpuSample(**{k: v for k, v in rec.items() if k in _GPU_FIELDS}),)

    return checked_record_parse(parse, ctx.health, bad_record=(TypeError, ValueError))


SPEC = SourceSpec(NAME, ROWS, build, stream=NVML, parser=record_parser)
