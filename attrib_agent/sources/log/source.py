"""The vLLM log source: a follower (file or stdin) and the line parser, so events leave it typed."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, cast

from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting
from attrib_agent.events import Event
from attrib_agent.recording import LOG
from attrib_agent.sources.log.parser import LogLineParser
from attrib_agent.sources.log.pipe import pipe_filling, widen_pipe
from attrib_agent.sources.log.tailer import POLL_INTERVAL_S, BinaryReader, LogFollower, StdinLines
from attrib_agent.sources.source import Emit, ReplayContext, SourceContext, SourceSpec

if TYPE_CHECKING:
    from attrib_agent.config.load import AgentConfig

logger = logging.getLogger(__name__)

NAME = "vllm_log"
ROWS: Final[tuple[Setting[Any], ...]] = (
    Setting("log_file", "vllm", v.path, None, "follow vLLM's log file (like tail -F); excludes log_stdin",
            "PATH", live=True, default_text="none"),
    Setting("log_stdin", "vllm", v.parse_bool, False, "read vLLM's log from standard input (vLLM's output piped "
            "in); excludes log_file", boolean=True, live=True),
    Setting("log_stdin_when_full", "vllm", v.choice(("drop_newest", "block")), "drop_newest",
            "what log_stdin does when the agent is behind and the pipe is half full: `drop_newest` (drop lines, "
            "counted as skipped `queue_full`, so vLLM never blocks writing its log) or `block` (lose nothing; "
            "vLLM's API server stalls once the pipe is full)", "drop_newest|block", live=True),
    Setting("log_from", "vllm", v.choice(("end", "start")), "end",
            "where to start reading log_file: `end` (only new lines) or `start` (the whole file)", "end|start",
            live=True),
    Setting("log_poll_interval_s", "vllm", v.seconds(0.01), POLL_INTERVAL_S,
            "how often log_file is checked for new lines", "SECONDS", live=True),
)


class LogSource:
    """Follows vLLM's log and parses each line into events (Iteration steps, request lifecycle lines)."""

    name = NAME

    def __init__(self, follower: LogFollower | StdinLines) -> None:
        self.follower = follower
        self.parser = LogLineParser(follower.health)
        self.started = asyncio.Event()

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        closer = asyncio.create_task(self._close_on(stop))
        self.started.set()
        try:
            async for ts, line in self.follower.lines():
                for ev in self.parser.parse_all(line, ts):
                    emit(ev)
        finally:
            closer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await closer

    async def _close_on(self, stop: asyncio.Event) -> None:
        await stop.wait()
        self.follower.close()

    async def aclose(self) -> None:
        self.follower.close()


def build(cfg: AgentConfig, ctx: SourceContext) -> LogSource | None:
    if cfg.log_file:
        return LogSource(LogFollower(cfg.log_file, from_start=cfg.log_from_start, clock=ctx.clock,
                                     poll_interval_s=cfg.log_poll_interval_s, health=ctx.health(NAME)))
    if cfg.log_stdin:
        widened = widen_pipe(sys.stdin.fileno())  # a stalled agent must not block vLLM's log writes (pipe.py)
        if widened is not None:
            logger.info("reading vLLM's log from a pipe of %d bytes", widened)
        spill = pipe_filling(sys.stdin.fileno()) if cfg.log_stdin_when_full == "drop_newest" else None
        return LogSource(StdinLines(cast(BinaryReader, sys.stdin.buffer), clock=ctx.clock, health=ctx.health(NAME),
                                    spill=spill))
    return None


class LogRecordParser:
    """A recorded line (`{"ts", "line"}`) through the live source's line parser (`line_parser`: its id maps)."""

    def __init__(self, ctx: ReplayContext) -> None:
        self.line_parser = LogLineParser(ctx.health)
        self._health = ctx.health
        self._parse_all = self.line_parser.parse_all

    def __call__(self, rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
        try:
            line = rec["line"]
        except KeyError:
            self._health.skip("malformed_record")
            return ()
        return self._parse_all(line if type(line) is str else str(line), ts)


SPEC = SourceSpec(NAME, ROWS, build, stream=LOG,
                  parser=LogRecordParser)
