"""Replay: a recording directory played through the live parsers, in receipt-time order.

Recordings hold raw input, so replay exercises exactly the code the live sources run: the metrics
parser and counter tracker, the log-line parser, the OTLP decoder. Events come out merged across
streams by receipt timestamp, either as fast as possible or paced at (a multiple of) recorded speed.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
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


def merge_by_receipt(streams: Sequence[Iterator[dict[str, Any]]]) -> Iterator[tuple[float, int, dict[str, Any]]]:
    """(ts, stream index, record) in the order `heapq.merge` gives keys (ts, place in its stream, stream index).

    At GPU rates one stream (the log) holds ~99 % of the records: the stream with the least head runs on while
    its head stays below the least other head (one comparison a record) instead of a heap step per record.
    """
    heads: list[tuple[float, int, int, dict[str, Any]]] = []
    for index, it in enumerate(streams):
        first = next(it, None)
        if first is not None:
            heads.append((float(first["ts"]), 0, index, first))
    while heads:
        heads.sort(key=lambda h: h[:3])
        ts, seq, index, rec = heads[0]
        it = streams[index]
        bound_ts, bound_rest = (heads[1][0], heads[1][1:3]) if len(heads) > 1 else (math.inf, (math.inf, 0))
        while True:
            yield ts, index, rec
            nxt = next(it, None)
            if nxt is None:
                del heads[0]
                break
            seq += 1
            ts, rec = float(nxt["ts"]), nxt
            if ts > bound_ts or (ts == bound_ts and (seq, index) > bound_rest):  # keys never tie (index)
                heads[0] = (ts, seq, index, rec)
                break


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

    def events(self) -> Iterator[Event]:
        """Every event, merged by receipt time (ties: the earlier place in its own stream, then the streams' order)."""
        parsers = [self.parsers[s] for s in self._streams]
        for ts, index, rec in merge_by_receipt([self.recording.records(s) for s in self._streams]):
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
