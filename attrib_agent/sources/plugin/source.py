"""The exact-mode source: the step plugin's datagrams on a unix socket the agent binds (docs/exact-mode.md).

Off unless `plugin_socket` is set. The agent binds the path (vLLM's plugin connects to it and drops when
nobody listens) and a reader thread of its own drains the socket into a bounded backlog, so the kernel's
small datagram queue (`net.unix.max_dgram_qlen`, often 10) keeps emptying while the event loop settles
results (CI dropped 11 steps when the loop read it itself). The loop turns the backlog into one typed event
per datagram. Bad datagrams, and a backlog over its bound, are counted in the source's health and skipped.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import threading
from collections import deque
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
RCVBUF_BYTES = 4 * 2**20  # room for a burst of steps while the reader thread waits for the GIL
MAX_BACKLOG_BYTES = 64 * 2**20  # datagrams read but not yet parsed (~60 s of 100 steps/s of 10 KB messages)
RECV_POLL_S = 0.2  # the reader thread looks at its stop flag this often
logger = logging.getLogger(__name__)
ROWS: Final[tuple[Setting[Any], ...]] = (
    Setting("plugin_socket", "vllm", v.path, None, "exact mode: bind this unix datagram socket for vLLM's step "
            "plugin (its ATTRIB_PLUGIN_SOCKET; docs/exact-mode.md)", "PATH", live=True,
            default_text="none (exact mode off)"),
)


class PluginSource:
    name = NAME

    def __init__(self, path: Path, health: SourceHealth, clock: Callable[[], float], engine: int = 0,
                 max_backlog_bytes: int = MAX_BACKLOG_BYTES) -> None:
        self.path, self.health, self._clock, self._engine = path, health, clock, engine
        self.max_backlog_bytes = max_backlog_bytes
        self.started = asyncio.Event()
        self._sock: socket.socket | None = None
        self._thread: threading.Thread | None = None
        self._stopping = threading.Event()
        self._lock = threading.Lock()
        self._backlog: deque[tuple[bytes, float]] = deque()
        self._backlog_bytes = 0
        self._wake_pending = False
        self._overflow_pending = 0
        self.overflowed = 0  # datagrams dropped because the backlog was full (also in health as `backlog_full`)

    async def run(self, emit: Emit, stop: asyncio.Event) -> None:
        sock = self._sock = bind_datagram(self.path)
        sock.settimeout(RECV_POLL_S)
        loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._read_loop, args=(sock, loop, emit), name="attrib-plugin-recv",
                                        daemon=True)
        self._thread.start()
        self.started.set()
        logger.info("exact mode: listening for the vLLM step plugin on %s", self.path)
        await wait_for_stop(stop)

    def _read_loop(self, sock: socket.socket, loop: asyncio.AbstractEventLoop, emit: Emit) -> None:
        """The reader thread: receive, stamp, queue; wake the loop once per batch. Health is touched on the loop."""
        while not self._stopping.is_set():
            try:
                data = sock.recv(MAX_DATAGRAM + 1)
            except TimeoutError:
                continue
            except OSError as e:
                if not self._stopping.is_set():
                    with contextlib.suppress(RuntimeError):
                        loop.call_soon_threadsafe(self.health.error, "recv", self._clock(), str(e))
                return
            if self._enqueue(data, self._clock()):
                try:
                    loop.call_soon_threadsafe(self._drain, emit)
                except RuntimeError:  # the loop closed under us: shutting down
                    return

    def _enqueue(self, data: bytes, ts: float) -> bool:
        """Queue one datagram (or count it when the backlog is full); True when the loop must be woken."""
        with self._lock:
            if self._backlog_bytes + len(data) > self.max_backlog_bytes:
                self._overflow_pending += 1
                self.overflowed += 1
            else:
                self._backlog.append((data, ts))
                self._backlog_bytes += len(data)
            wake = not self._wake_pending
            self._wake_pending = True
        return wake

    def _drain(self, emit: Emit) -> None:
        """On the loop: parse everything the reader thread queued."""
        with self._lock:
            batch, self._backlog = self._backlog, deque()
            overflow, self._overflow_pending = self._overflow_pending, 0
            self._backlog_bytes = 0
            self._wake_pending = False
        if overflow:
            self.health.skip("backlog_full", overflow)
        for data, ts in batch:
            self.feed(data, emit, ts)

    def feed(self, data: bytes, emit: Emit, ts: float | None = None) -> None:
        """One datagram: an event, or a counted skip."""
        ts = self._clock() if ts is None else ts
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
        self._stopping.set()
        if self._thread is not None:
            await asyncio.to_thread(self._thread.join, RECV_POLL_S * 5)
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
