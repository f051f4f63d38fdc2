"""The journal's files: segment names, finding them, and reading one back line by line.

Reading is defensive because a journal outlives the process that wrote it: a kill leaves a torn last line,
a disk error leaves junk, and anything in the directory may not be ours. Nothing here raises on bad content;
it counts it (`malformed`, `truncated`, `too_long`, `read`) in the caller's error counter.
"""

from __future__ import annotations

import json
import logging
import re
import stat
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, Final

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_codec import from_dict

logger = logging.getLogger(__name__)

SEGMENT_NAME: Final = re.compile(r"results-(\d{1,18})\.ndjson")


@dataclass(slots=True)
class Segment:
    seq: int
    path: Path
    size: int  # bytes written so far
    mtime: float  # last write (unix seconds): what max_age_s is measured from


def segment_path(directory: Path, seq: int) -> Path:
    """Zero-padded so a directory listing sorts segments in write order."""
    return directory / f"results-{seq:010d}.ndjson"


def scan_segments(directory: Path) -> list[Segment]:
    """The segments in `directory`, oldest first; only regular files named like ours (a device or a
    directory of that name is no segment, and reading one could never end)."""
    found: list[Segment] = []
    for entry in directory.iterdir():
        m = SEGMENT_NAME.fullmatch(entry.name)
        if m is None:
            continue
        try:
            st = entry.stat()
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            found.append(Segment(int(m.group(1)), entry, st.st_size, st.st_mtime))
    return sorted(found, key=lambda s: s.seq)


def highest_seq(directory: Path) -> int:
    """The largest sequence number any entry named like a segment uses (0 if none): a new segment takes the
    next one, so it never opens a name something else already holds."""
    return max((int(m.group(1)) for e in directory.iterdir() if (m := SEGMENT_NAME.fullmatch(e.name))), default=0)


ENDED_STATUSES: Final = ("aborted", "skipped")


@dataclass(frozen=True, slots=True)
class Ended:
    """A request that ended without a result (`{"request_id": ..., "ended": "aborted"|"skipped"}`)."""

    request_id: str
    status: str


def read_segment(path: Path, errors: Counter[str], *, max_line: int) -> Iterator[AttributionResult | Ended]:
    """The results and ended records in one segment, in file order; bad lines are counted and skipped.

    A last line without its newline is a write torn by a kill (`truncated`), even if it happens to parse:
    the writer always ends a record with a newline, so it was not finished.
    """
    try:
        f = path.open("rb")
    except OSError as e:
        errors["read"] += 1
        logger.warning("journal segment %s unreadable: %s", path.name, e.strerror or e)
        return
    with f:
        while True:
            try:
                line = f.readline(max_line)
            except OSError as e:
                errors["read"] += 1
                logger.warning("journal segment %s read failed: %s", path.name, e.strerror or e)
                return
            if not line:
                return
            if not line.endswith(b"\n"):
                if len(line) < max_line:
                    errors["truncated"] += 1
                    return
                errors["too_long"] += 1
                _skip_rest_of_line(f, max_line)
                continue
            result = _decode(line)
            if result is None:
                errors["malformed"] += 1
            else:
                yield result


def _decode(line: bytes) -> AttributionResult | Ended | None:
    try:
        d = json.loads(line)
        if isinstance(d, dict) and set(d) == {"request_id", "ended"}:
            rid, status = d["request_id"], d["ended"]
            return Ended(rid, status) if isinstance(rid, str) and status in ENDED_STATUSES else None
        return from_dict(d) if isinstance(d, dict) else None
    except (ValueError, KeyError, TypeError, AttributeError, RecursionError, OverflowError):  # (int(Infinity))
        return None


def _skip_rest_of_line(f: BinaryIO, max_line: int) -> None:
    while True:
        chunk = f.readline(max_line)
        if not chunk or chunk.endswith(b"\n"):
            return
