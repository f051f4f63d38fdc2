"""Fuzz the log tailer's line framing: 10,000 byte streams (real log lines, CR/LF/CRLF endings, lines over the
limit, invalid UTF-8, no final newline) cut into reads at arbitrary points. The lines out must equal a one-shot
split of the whole stream, whatever the cuts; a line over the limit is kept to its first `max_line_bytes` bytes
and counted as `line_too_long`."""

from __future__ import annotations

import random
from typing import Any

from attrib_agent.recording import LOG, Recording

from .mutate import CASES, Mutator, Tally


def _splitter() -> Any:
    """The one import of the code under test (its module path may move)."""
    from attrib_agent import health
    from attrib_agent.sources.log import tailer as log_tailer

    return log_tailer.LineSplitter, health.SourceHealth


def expected(stream: bytes, max_line: int) -> tuple[list[str], int]:
    """Lines from the whole stream at once, and how many went over the limit: the model the splitter must match."""
    parts = stream.split(b"\n")
    tail = parts.pop()
    if tail:
        parts.append(tail)  # the unfinished last line, given by flush()
    out, too_long = [], 0
    for raw in parts:
        line = raw[:max_line].decode("utf-8", "replace")
        if len(raw) > max_line:
            too_long += 1
            if raw.endswith(b"\r") and not line.endswith("\r"):
                line += "\r"
        out.append(line)
    return out, too_long


def test_fuzz_line_framing(fixtures_dir: Any) -> None:
    splitter_cls, health_cls = _splitter()
    lines = [r["line"].encode() for r in Recording(fixtures_dir / "recordings" / "canary").records(LOG)]
    mut, rng, tally = Mutator(lines, seed=1303), random.Random(1303), Tally("log line framing")
    total_lines = 0
    for _ in range(CASES):
        max_line = rng.choice((8, 64, 200, 1024, 65_536))
        pieces = []
        for _ in range(rng.randint(0, 12)):
            line = mut.one(max_ops=2) if rng.random() < 0.5 else rng.choice(lines)
            if rng.random() < 0.1:
                line *= rng.randint(2, 40)  # a huge line
            pieces.append(line + rng.choice((b"\n", b"\r\n", b"\n", b"\r", b"")))
        stream = b"".join(pieces)
        cuts = sorted(rng.sample(range(len(stream) + 1), min(len(stream) + 1, rng.randint(0, 20))))
        health = health_cls("log")
        sp = splitter_cls(max_line, health)
        got: list[str] = []
        prev = 0
        for cut in [*cuts, len(stream)]:
            got += sp.feed(stream[prev:cut])
            prev = cut
            assert sp.pending_bytes <= max_line
        last = sp.flush()
        if last is not None:
            got.append(last)
        want, too_long = expected(stream, max_line)
        assert got == want, (stream[:200], cuts, max_line)
        assert health.skipped["line_too_long"] == too_long
        total_lines += len(got)
        tally.add("lines_cut" if too_long else "lines_whole")
    tally.report()
    print(f"{total_lines:,} lines framed")
