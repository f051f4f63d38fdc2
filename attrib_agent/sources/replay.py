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
from dataclasses import fields
from typing import Any, Final

from attrib_agent.events import Event, GpuSample
from attrib_agent.health import SourceHealth
from attrib_agent.recording import LOG, METRICS, NVML, OTLP, VLLM_STEPS, Recording, otlp_body
from attrib_agent.sources.log.parser import LogLineParser
from attrib_agent.sources.metrics.parser import CounterTracker, MetricsParseError, parse_metrics
from attrib_agent.sources.otlp.decode import OtlpError, decode_export
from attrib_agent.sources.plugin.parse import PluginParseError, PluginSkip, parse_message

MAX_OTLP_DECOMPRESSED: Final = 64 * 1024 * 1024
_INPUT_STREAMS: Final = (METRICS, LOG, OTLP, NVML)  # client.jsonl is the lab's, not an agent input
# The step plugin's stream is an input only in exact mode (`exact=True`, `replay --exact`): without it a
# recording made with --truth-plugin replays as the sidecar-only agent would see it, so it can score that.
_GPU_FIELDS: Final = frozenset(f.name for f in fields(GpuSample))


class ReplaySource:
    """Events of one recording. `health` has one SourceHealth per stream, as the live sources keep.
    `exact`: also the step plugin's `vllm_steps` stream, through the live plugin source's parser."""

    def __init__(self, path: str | os.PathLike[str], *, max_otlp_decompressed: int = MAX_OTLP_DECOMPRESSED,
                 exact: bool = False, engine: int = 0) -> None:
        self.recording = Recording(path)
        self._streams = (*_INPUT_STREAMS, VLLM_STEPS) if exact else _INPUT_STREAMS
        self._engine = engine
        self.health: dict[str, SourceHealth] = {s: SourceHealth(s) for s in self._streams}
        self._tracker = CounterTracker()
        self._log_parser = LogLineParser(self.health[LOG])
        self._max_otlp = max_otlp_decompressed

    def _stream(self, stream: str) -> Iterator[tuple[float, int, str, dict[str, Any]]]:
        for seq, rec in enumerate(self.recording.records(stream)):
            yield float(rec["ts"]), seq, stream, rec

    def events(self) -> Iterator[Event]:
        """Every event, merged by receipt time (ties keep each stream's file order)."""
        merged = heapq.merge(*(self._stream(s) for s in self._streams), key=lambda x: (x[0], x[1]))
        for ts, _seq, stream, rec in merged:
            yield from self._parse(stream, ts, rec)
        for stream in self._streams:
            st = self.recording.stats.get(stream)
            if st is not None and st.skipped:
                self.health[stream].skip("malformed_record", st.skipped)

    def _parse(self, stream: str, ts: float, rec: dict[str, Any]) -> list[Event]:
        health = self.health[stream]
        try:
            if stream == METRICS:
                snaps = self._tracker.observe(parse_metrics(str(rec["text"]), ts))
                health.success(ts)
                return list(snaps)
            if stream == LOG:
                return list(self._log_parser.parse_all(str(rec["line"]), ts))
            if stream == OTLP:
                result = decode_export(otlp_body(rec), content_type=rec.get("content_type"),
                                       content_encoding=rec.get("content_encoding"), ts=ts,
                                       max_decompressed=self._max_otlp)
                health.success(ts)
                return list(result.spans)
            if stream == VLLM_STEPS:
                step = parse_message(rec, ts, self._engine)
                health.success(ts)
                return [step]
            sample = GpuSample(**{k: v for k, v in rec.items() if k in _GPU_FIELDS})
            health.success(ts)
            return [sample]
        except (MetricsParseError, OtlpError):
            health.skip("malformed")
        except (PluginParseError, PluginSkip) as e:
            health.skip(e.reason)
        except (KeyError, TypeError, ValueError):
            health.skip("malformed_record")
        return []

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
