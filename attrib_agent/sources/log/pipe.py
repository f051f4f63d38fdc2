"""vLLM's log pipe, widened: vLLM logs synchronously from its API server's event loop, so a reader that stalls
(a busy agent reading `--log-stdin`, the lab's capture) fills the kernel's default 64 KiB pipe in well under a
second and vLLM then blocks in its log write, receiving no request and streaming no token until the reader reads
again. Measured in the lab: shorts waited up to 1.05 s before vLLM received them (docs/attribution.md)."""

from __future__ import annotations

import array
import fcntl
import termios
from collections.abc import Callable
from pathlib import Path
from typing import Final

# 1 MiB (Linux's default fs.pipe-max-size) holds ~8 s of vLLM's per-iteration log (~130 KB/s with
# --enable-logging-iteration-details), against reader stalls of at most 1.6 s seen in the lab's truths.
LOG_PIPE_BYTES: Final = 1 << 20


def widen_pipe(fd: int, size: int = LOG_PIPE_BYTES) -> int | None:
    """Grow the pipe on `fd` to `size` bytes (or the most the kernel allows) so a stalled reader does not block
    vLLM's logging writer; returns the capacity it then has, None when `fd` is no pipe (a file, a terminal)."""
    try:
        current = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except OSError:
        return None
    for want in (size, _pipe_max_size()):
        if want is None or want <= current:
            continue
        try:
            return fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, want)
        except OSError:  # over fs.pipe-max-size without CAP_SYS_RESOURCE, or over the user's pipe quota
            continue
    return current


def _pipe_max_size() -> int | None:
    """The largest pipe an unprivileged process may ask for (fs.pipe-max-size)."""
    try:
        return int(Path("/proc/sys/fs/pipe-max-size").read_text())
    except (OSError, ValueError):
        return None


def pipe_filling(fd: int) -> Callable[[], bool] | None:
    """A check that the pipe on `fd` holds at least half its capacity unread: the moment a reader that is behind
    must read and drop rather than wait, or vLLM's next log write would soon block. None when `fd` is no pipe
    (a file redirected to stdin never blocks its writer, so the reader may always wait)."""
    try:
        fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    except OSError:
        return None

    def filling() -> bool:
        pending = array.array("i", [0])
        try:
            fcntl.ioctl(fd, termios.FIONREAD, pending, True)
            return pending[0] * 2 >= fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
        except OSError:  # the pipe went away: nothing left to protect
            return False

    return filling
