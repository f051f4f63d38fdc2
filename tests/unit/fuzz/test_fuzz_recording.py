"""Fuzz the recording reader: 10,000 recordings whose meta.json or stream file (plain, gzip or xz jsonl) is a
mutation of a real one. Opening raises only RecordingError; reading a stream yields objects with a numeric `ts`
and counts every other line as skipped; a damaged compressed stream ends the stream with a counted skip."""

from __future__ import annotations

import gzip
import lzma
import random
from pathlib import Path
from typing import Any

from .mutate import CASES, Mutator, Tally

FIXTURE = Path(__file__).parents[2] / "fixtures" / "recordings" / "canary"


def _recording() -> Any:
    """The one import of the code under test (its module path may move)."""
    from attrib_agent import recording

    return recording


def test_fuzz_recording_reader(tmp_path: Path) -> None:
    rec_mod = _recording()
    meta = (FIXTURE / "meta.json").read_bytes()
    streams = {s: lzma.decompress((FIXTURE / f"{s}.jsonl.xz").read_bytes()) for s in ("client", "log", "otlp")}
    line_corpus = [line + b"\n" for body in streams.values() for line in body.splitlines()]
    meta_mut = Mutator([meta], seed=1306)
    line_mut, rng, tally = Mutator(line_corpus, seed=1307), random.Random(1307), Tally("recording reader")
    d = tmp_path / "rec"
    d.mkdir()
    records = skipped = 0
    for i in range(CASES):
        for p in d.iterdir():
            p.unlink()
        if i % 10 == 0:  # meta.json damaged: a typed error or a recording that still opens
            (d / "meta.json").write_bytes(meta_mut.one())
        else:
            (d / "meta.json").write_bytes(meta)
        body = b"".join(line_mut.one(max_ops=2) if rng.random() < 0.6 else rng.choice(line_corpus)
                        for _ in range(rng.randint(1, 8)))
        kind = rng.choice(("jsonl", "jsonl", "jsonl.gz", "jsonl.xz"))
        if kind != "jsonl":
            body = gzip.compress(body, 1) if kind == "jsonl.gz" else lzma.compress(body, preset=0)
            if rng.random() < 0.5:  # the compressed file itself damaged (torn write, bit rot)
                body = Mutator([body], seed=i).one(max_ops=2)
        (d / f"log.{kind}").write_bytes(body)
        try:
            rec = rec_mod.Recording(d)
        except rec_mod.RecordingError:
            tally.add("typed_error")
            continue
        got = list(rec.records("log"))
        assert all(isinstance(r, dict) and isinstance(r.get("ts"), int | float) for r in got)
        records += len(got)
        skipped += rec.stats["log"].skipped
        tally.add("read")
    tally.report()
    print(f"{records:,} records read, {skipped:,} lines skipped and counted")
