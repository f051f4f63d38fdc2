"""Replay: a recording directory played through the live parsers, in receipt-time order.

Recordings hold raw input, so replay exercises exactly the code the live sources run: the metrics
parser and counter tracker, the log-line parser, the OTLP decoder. Events come out merged across
streams by receipt timestamp, either as fast as possible or paced at (a multiple of) recorded speed.
"""

from __future__ import annotations

import asyncio
import heapq
import os
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any, Final

from attrib_agent.events import Event
from attrib_agent.health import SourceHealth
from attrib_agent.recording import LOG, METRICS, NVML, OTLP, VLLM_STEPS, Recording
from attrib_agent.sources.registry import SOURCES
from attrib_agent.sources.source import RecordParse, ReplayContext

MAX_OTLP_DECOMPRESSED: Final = 64 * 1024 * 1024
_INPUT_STREAMS: Final = (METRICS, LOG, OTLP, NVML)  # client.jsonl is the lab's, not an agent input
# The step plugin's stream is an input only in exact mode (`exact=True`, `replay --exact`): without it a
# recording made with --truth-plugin replays as the sidecar-only agent would see it, so it can score that.


class ReplaySource:
    """Events of one recording. `health` has one SourceHealth per stream, as the live sources keep.
    `exact`: also the step plugin's `vllm_steps` stream. Each stream is parsed by the parser its live source
    registers (`SourceSpec.parser`): replay runs the live code, one record at a time."""

    def __init__(self, path: str | os.PathLike[str], *, max_otlp_decompressed: int = MAX_OTLP_DECOMPRESSED,
                 exact: bool = False, engine: int = 0) -> None:
        self.recording = Recording(path)
        self._streams = (*_INPUT_STREAMS, VLLM_STEPS) if exact else _INPUT_STREAMS
        self.health: dict[str, SourceHealth] = {s: SourceHealth(s) for s in self._streams}
        makers = {spec.stream: spec.parser for spec in SOURCES if spec.stream is not None and spec.parser is not None}
        self.parsers: dict[str, RecordParse] = {
            s: makers[s](ReplayContext(self.health[s], engine, max_otlp_decompressed)) for s in self._streams}

    def _stream(self, index: int, stream: str) -> Iterator[tuple[float, int, int, dict[str, Any]]]:
        for seq, rec in enumerate(self.recording.records(stream)):
            yield float(rec["ts"]), seq, index, rec

    def events(self) -> Iterator[Event]:
        """Every event, merged by receipt time (ties keep each stream's file order, then the streams' order)."""
        parsers = [self.parsers[s] for s in self._streams]
        for ts, _seq, index, rec in heapq.merge(*(self._stream(i, s) for i, s in enumerate(self._streams))):
            yield from parsers[index](rec, ts)
        for stream in self._streams:
            st = self.recording.stats.get(stream)
            if st is not None and st.skipped:
                self.health[stream].skip("malformed_record", st.skipped)

    async def play(
        self,
        emit: Callable[[Event], Awaitable[None] | None],
        *,
        speed: float | None = None,
        sleep: Callable[[float], Awaitable[None]] = asyncio.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> int:
        """Emit every event; `speed=None` as fast as possible, else paced at `speed` x recorded time."""
        if speed is not None and speed <= 0:
            raise ValueError("speed must be positive")
        n = 0
        t0_rec: float | None = None
        t0_wall = clock()
        for ev in self.events():
            if speed is not None:
                t0_rec = ev.ts if t0_rec is None else t0_rec
                wait = (ev.ts - t0_rec) / speed - (clock() - t0_wall)
                if wait > 0:
                    await sleep(wait)
            out = emit(ev)
            if out is not None:
                await out
            n += 1
        return n
