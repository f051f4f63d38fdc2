"""Where step messages go: a unix datagram socket (the agent, or the lab's capture) and/or an NDJSON file.

Sending never blocks the engine: the socket is non-blocking, and a message nobody is listening for, or that
finds the receiver's buffer full, is dropped and counted (the count rides on the next message as `drops`).
"""

from __future__ import annotations

import errno
import json
import os
import socket
from typing import IO, Any

ENV_SOCKET = "ATTRIB_PLUGIN_SOCKET"
ENV_FILE = "ATTRIB_PLUGIN_FILE"
MAX_DATAGRAM = 200_000  # under Linux's default unix datagram limit (net.core.wmem_default, 212,992 bytes)
# How long the sender thread waits for a full receiver before dropping a message. Only that thread waits (the
# engine's bounded queue holds ~10 s of steps), so the wait covers a receiver briefly starved of CPU beside a busy
# vLLM (0.25 s dropped 11 steps in CI) without holding anything up; a receiver that must miss nothing (the lab's
# truth recorder) sets a longer one.
SEND_WAIT_S = 2.0
ENV_SEND_WAIT = "ATTRIB_PLUGIN_SEND_WAIT_S"
MAX_SEND_WAIT_S = 60.0


def send_wait_s(env: dict[str, str]) -> float:
    """The sender's wait from the environment; anything unreadable or out of range keeps the default."""
    try:
        wait = float(env.get(ENV_SEND_WAIT, SEND_WAIT_S))
    except ValueError:
        return SEND_WAIT_S
    return wait if 0 < wait <= MAX_SEND_WAIT_S else SEND_WAIT_S

# Errors that mean "nobody to hear it now": dropped and counted, never raised.
_DROP_ERRNOS = {errno.EAGAIN, errno.EWOULDBLOCK, errno.ENOENT, errno.ECONNREFUSED, errno.ENOBUFS, errno.EMSGSIZE,
                errno.ENOTCONN}


def encode(record: dict[str, Any]) -> bytes:
    """One NDJSON line (compact, ASCII-safe UTF-8, trailing newline)."""
    return (json.dumps(record, separators=(",", ":")) + "\n").encode()


class DatagramChannel:
    """Sends to a unix datagram socket path that may or may not be bound yet (connected once it is).

    Connected, a full receiver makes `send` wait up to `wait_s` for room (Linux queues only
    `net.unix.max_dgram_qlen`, often 10, datagrams per receiver), then drop. Only the plugin's sender
    thread calls it, never the engine's: there a bounded queue takes the wait.
    """

    def __init__(self, path: str, wait_s: float = 0.0) -> None:
        self.path = path
        self.wait_s = wait_s
        self.sent = 0
        self.dropped = 0
        self._sock: socket.socket | None = None

    def _connect(self) -> socket.socket | None:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.connect(self.path)
            except OSError:
                sock.close()
                return None
            if self.wait_s > 0:
                sock.settimeout(self.wait_s)
            else:
                sock.setblocking(False)
            self._sock = sock
        return self._sock

    def send(self, data: bytes) -> bool:
        sock = self._connect() if len(data) <= MAX_DATAGRAM else None
        if sock is None:
            self.dropped += 1
            return False
        try:
            sock.send(data)
        except TimeoutError:
            self.dropped += 1
            return False
        except OSError as e:
            if e.errno not in _DROP_ERRNOS:
                raise
            if e.errno in (errno.ECONNREFUSED, errno.ENOTCONN, errno.ENOENT):
                self.close()  # the receiver went away: connect again on the next message
            self.dropped += 1
            return False
        self.sent += 1
        return True

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


class FileChannel:
    """Appends lines to a file (lab use: no receiver needed); one flush per line, so a crash loses one line."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.sent = 0
        self.dropped = 0
        self._f: IO[bytes] = open(path, "ab")  # noqa: SIM115 - lives as long as the engine

    def send(self, data: bytes) -> bool:
        self._f.write(data)
        self._f.flush()
        self.sent += 1
        return True

    def close(self) -> None:
        self._f.close()


class Fanout:
    """Every configured channel; `dropped` is what the socket lost (a file never drops)."""

    def __init__(self, channels: list[DatagramChannel | FileChannel]) -> None:
        self.channels = channels

    @classmethod
    def from_env(cls, env: dict[str, str] | None = None) -> Fanout | None:
        env = dict(os.environ) if env is None else env
        channels: list[DatagramChannel | FileChannel] = []
        if env.get(ENV_SOCKET):
            channels.append(DatagramChannel(env[ENV_SOCKET], send_wait_s(env)))
        if env.get(ENV_FILE):
            channels.append(FileChannel(env[ENV_FILE]))
        return cls(channels) if channels else None

    @property
    def dropped(self) -> int:
        return sum(c.dropped for c in self.channels)

    def send(self, record: dict[str, Any]) -> None:
        data = encode(record)
        for c in self.channels:
            c.send(data)

    def close(self) -> None:
        for c in self.channels:
            c.close()
