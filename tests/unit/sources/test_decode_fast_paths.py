"""The decode floor's shortcuts give what the plain code gives: the replay merge is heapq.merge's order, the
recording reader's json is json.loads, the log parser's first-character dispatch is read from the patterns."""

from __future__ import annotations

import heapq
import json
import random
import re
from typing import Any

import pytest

from attrib_agent.recording import Recording, RecordingWriter, _loads
from attrib_agent.sources.log import patterns as p
from attrib_agent.sources.log.parser import LEADS, ROWS, _by_first_char
from attrib_agent.sources.replay import merge_by_receipt


def _heap_order(streams: list[list[dict[str, Any]]]) -> list[tuple[float, int, int]]:
    keyed = [[(float(r["ts"]), seq, i) for seq, r in enumerate(s)] for i, s in enumerate(streams)]
    return list(heapq.merge(*keyed))


@pytest.mark.parametrize("seed", range(40))
def test_the_merge_is_heapq_merge_order_sorted_or_not_with_ties(seed: int) -> None:
    rng = random.Random(seed)
    streams = []
    for _ in range(rng.randrange(0, 5)):
        choices = [0.0, 1.0, 1.0, 2.0, 3.5, float("inf"), rng.random() * 4]
        times = [rng.choice(choices) for _ in range(rng.randrange(0, 30))]
        if rng.random() < 0.7:
            times.sort()
        streams.append([{"ts": t, "n": k} for k, t in enumerate(times)])
    got = [(ts, index, rec) for ts, index, rec in merge_by_receipt([iter(s) for s in streams])]
    want = _heap_order(streams)
    assert [(ts, rec["n"], index) for ts, index, rec in got] == want


@pytest.mark.parametrize("raw", ['{"ts": 1}\n', ' {"ts":1.5,"a":[1,2]} \n', '{"ts": 1} x\n', '\ufeff{"ts": 1}\n',
                                 '\n', '{"ts": 1', '[1, 2]\n', '"s"\n', '{"ts": NaN}\n', '{"a": 1e999}\n', 'nul\n'])
def test_the_readers_json_is_json_loads(raw: str) -> None:
    def outcome(load: Any) -> object:
        try:
            return ("ok", repr(load(raw)))
        except json.JSONDecodeError as e:
            return ("error", str(e))

    assert outcome(_loads) == outcome(json.loads)


def test_a_nan_receipt_time_is_a_malformed_record(tmp_path: Any) -> None:
    with RecordingWriter(tmp_path) as w:
        for ts in (1.0, float("nan"), 2.0):
            w.append("log", {"ts": ts, "line": "x"})
    rec = Recording(tmp_path)
    assert [r["ts"] for r in rec.records("log")] == [1.0, 2.0]
    assert rec.stats["log"].skipped == 1


def test_first_chars_are_read_from_the_patterns() -> None:
    assert p.first_chars(p.ITERATION) == {"E"}
    assert p.first_chars(p.RECEIVED) == {"R"} and p.first_chars(p.ADDED) == {"A"}
    assert p.first_chars(p.STATS) is None  # `N Engines Aggregated`: any digit, so tried for every message
    assert p.first_chars(re.compile("(?:ab|cd)e")) == {"a", "c"}
    assert p.first_chars(re.compile("a?b")) is None and p.first_chars(re.compile("abc", re.I)) is None
    assert p.first_chars(re.compile("")) is None


def test_every_row_a_message_can_match_is_tried_in_table_order() -> None:
    rows = _by_first_char(ROWS, lambda row: row.pattern)
    messages = ["Engine 000: Iteration(1): ...", "1 Engines Aggregated: Avg prompt throughput: 1 tokens/s",
                "Received request x: params: P(), lora_request: None.", "Added request x.", "Request x aborted.",
                "Aborted request(s) a,b.", "Request x failed.", "", "zzz", "Engine 0: Avg prompt throughput: 1"]
    for msg in messages:
        tried = rows.get(msg[:1]) or rows[""]
        matching = [row for row in ROWS if row.pattern.fullmatch(msg) or row.pattern.match(msg)]
        assert all(row in tried for row in matching)
        assert list(tried) == [row for row in ROWS if row in tried]  # first match still wins
    leads = _by_first_char(LEADS, lambda lead: lead[1])
    assert leads["E"] == tuple(lead for lead in LEADS if lead[0] in ("engine_step", "stats_line"))
