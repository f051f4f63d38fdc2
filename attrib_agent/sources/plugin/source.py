"""The exact-mode source: the step plugin's datagrams on a unix socket the agent binds (docs/exact-mode.md).

Off unless `plugin_socket` is set. The agent binds the path (vLLM's plugin connects to it and drops when
nobody listens), reads every datagram the kernel holds whenever the socket is readable, and emits one typed
event each. The kernel's receive queue is the bound; a burst over it is dropped by the sender, never waited
on. Bad datagrams are counted in the source's health and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

from attrib_agent.config import values as v
from attrib_agent.config.setting import Setting
from attrib_agent.events import Event
from attrib_agent.health import SourceHealth
from attrib_agent.recording import VLLM_STEPS
from attrib_agent.sources.plugin.parse import (
    MAX_DATAGRAM,
    PluginParseError,
    PluginSkip,
    parse_datagram,
    parse_message,
)
from attrib_agent.sources.source import (
    Emit,
    RecordParse,
    ReplayContext,
    SourceContext,
    SourceSpec,
    checked_record_parse,
    wait_for_stop,
)

if TYPE_CHECKING:
    from collections.abc import Callable

    from attrib_agent.config.load import AgentConfig

NAME = "vllm_plugin"
RCVBUF_BYTES = 4 * 2**20  # room for a burst of steps while the event loop is busy
MAX_PER_WAKEUP = 512  # datagrams read per readiness callback before yielding to the loop
logger = logging.getLogger(__name__)
ROWS: Final[tuple[Setting[Any], ...]] = (
    Setting("plugin_socket", "vllm", v.path, None, "exact mode: bind this unix datagram socket for vLLM's step "
            "plugin (its ATTRIB_PLUGIN_SOCKET; docs/exact-mode.md)", "PATH", live=True,
            default_text="none (exact mode off)"),
)


class PluginSource:
    name = NAME

    def __init__(self, path: Path, health: SourceHealth, clock: Callable[[], float], engine: int = 0) -> None:
        self.path, self.health, self._clock, self._engine = path, health, clock, engine
        self.started = asyncio.Event()
        self._sock: socket.socket | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        sock = self._sock = bind_datagram(self.path)
        self._loop = asyncio.get_running_loop()
        self._loop.add_reader(sock.fileno(), self._drain, sock, emit)
        self.started.set()
        logger.info("exact mode: listening for the vLLM step plugin on %s", self.path)
        await wait_for_stop(stop)

    def _drain(self, sock: socket.socket, emit: Emit) -> None:
        for _ in range(MAX_PER_WAKEUP):
            try:
                data = sock.recv(MAX_DATAGRAM + 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as e:
                self.health.error("recv", self._clock(), str(e))
                return
            self.feed(data, emit)

    def feed(self, data: bytes, emit: Emit) -> None:
        """One datagram: an event, or a counted skip."""
        ts = self._clock()
        try:
            emit(parse_datagram(data, ts, self._engine))
        except PluginSkip as s:
            self.health.skip(s.reason)
        except PluginParseError as e:
            self.health.skip(e.reason)
        else:
            self.health.success(ts)

    async def aclose(self) -> None:
        sock, self._sock = self._sock, None
        if sock is None:
            return
        if self._loop is not None:
            self._loop.remove_reader(sock.fileno())
        sock.close()
        with contextlib.suppress(OSError):
            self.path.unlink()


def bind_datagram(path: Path) -> socket.socket:
    """Bind a non-blocking unix datagram socket at `path`, replacing a stale socket file (never another file)."""
    with contextlib.suppress(FileNotFoundError):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise OSError(f"{path} exists and is not a socket")
        path.unlink()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    try:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, RCVBUF_BYTES)
        sock.bind(str(path))
        sock.setblocking(False)
    except OSError:
        sock.close()
        raise
    return sock


def build(cfg: AgentConfig, ctx: SourceContext) -> PluginSource | None:
    if cfg.plugin_socket is None:
        return None
    return PluginSource(cfg.plugin_socket, ctx.health(NAME), ctx.clock, cfg.engine)


def record_parser(ctx: ReplayContext) -> RecordParse:
    """A recorded message (the datagram's object plus `ts`) through the live source's message parser."""

    def parse(rec: Mapping[str, Any], ts: float) -> Sequence[Event]:
        return (parse_message(rec, ts, ctx.engine),)

    def reason(e: Exception) -> str:
        return e.reason if isinstance(e, PluginParseError | PluginSkip) else "malformed"

    return checked_record_parse(parse, ctx.health, bad_input=(PluginParseError, PluginSkip), reason=reason,
                                bad_record=(KeyError, TypeError, ValueError))


SPEC = SourceSpec(NAME, ROWS, build, stream=VLLM_STEPS, parser=record_parser)
