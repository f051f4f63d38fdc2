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


_LINES = ['{"ts": 1}\n', ' {"ts":1.5,"a":[1,2]} \n', '{"ts": 1} x\n', '\ufeff{"ts": 1}\n', '{"ts":2,"line":"a"}\n',
          '{"ts": 1\n', '[1, 2]\n', '"s"\n', '{"ts": NaN}\n', '{"a": 1e999}\n', 'nul\n', '{"ts":3}  \n', '{"ts":4}\t\n',
          '{"ts":5,"x":' + "[" * 100_000 + "\n", '{"ts":6e999}\n', '{"ts":7,"line":"\\u001b[0m"}\n']


def test_the_readers_records_are_json_loads_lines_and_bad_ones_counted(tmp_path: Any) -> None:
    """The reader's scanner shortcut keeps exactly the lines json.loads reads as an object with a numeric ts, in
    order, and counts every other (a line nested too deep for the scanner too: it used to stop the replay)."""
    RecordingWriter(tmp_path).close()
    (tmp_path / "log.jsonl").write_text("".join(_LINES))
    want = []
    for raw in _LINES:
        try:
            obj = json.loads(raw)
        except (ValueError, RecursionError):
            continue
        if isinstance(obj, dict) and isinstance(obj.get("ts"), int | float) and obj["ts"] == obj["ts"]:
            want.append(obj)
    rec = Recording(tmp_path)
    got = list(rec.records("log"))
    assert repr(got) == repr(want) and len(want) == 7
    assert rec.stats["log"].skipped == len(_LINES) - len(want)
    (tmp_path / "log.jsonl").write_text('{"ts":1,"x":' + "[" * 100_000 + '\n{"ts":2}\n')
    rec = Recording(tmp_path)
    assert list(rec.records("log")) == [{"ts": 2}]
    assert rec.stats["log"].skipped == 1 and rec.stats["log"].skipped_examples == ["log.jsonl:1: RecursionError"]


def _step_lines() -> list[str]:
    base = ("(APIServer pid=9312) INFO 2026-11-25 12:39:15.052 [loggers.py:199] Engine 000: Iteration(91): 0 context "
            "requests, 0 context tokens, 4 generation requests, 4 generation tokens, iteration elapsed time: 0.19 ms, "
            "CPU KV cache usage: 21.1%")
    lines = [base, base.replace("2026-11-25 ", "").replace(".052", ""), base.replace("0.19 ms", "0.19 ms (dummy)"),
             base + ", encoder inputs: 1, encoder output embeddings: 2", "x" + base, "\x1b[32m" + base,
             base.replace("(APIServer", "((APIServer"), base + "\r", base.replace("000", "٠٠٠"),
             base.replace("[loggers.py:199]", "[a:b:199]"), base.replace("Engine 000", "Engine 0000000"),
             "(APIServer pid=9312) INFO 2026-11-25 12:39:15.052 [x.py:1] Request r details: Engine 0: Iteration(1)",
             base.replace("12:39:15", "12:39:61"), base.replace("(APIServer", "(\x1b[1mAPIServer")]
    rng = random.Random(7)
    for _ in range(400):
        line = rng.choice(lines[:4])
        k = rng.randrange(len(line))
        lines.append(line[:k] + rng.choice("0(): ,.%\r\x1b\n\t٣x") + line[k + rng.randrange(2):])
    return lines


def test_the_step_line_shortcut_gives_what_the_table_walk_gives(monkeypatch: pytest.MonkeyPatch) -> None:
    """Real and mangled step lines, in runs with the lines that open and continue records around them, give the
    same events, health counts and record state with the one-match step line as with the table's walk."""
    from attrib_agent.health import SourceHealth
    from attrib_agent.sources.log import parser

    assert parser._STEP_LINE is not None
    opener = "(APIServer pid=9312) INFO 2026-11-25 12:39:15.052 [x.py:1] Request r failed due to ValueError: x"
    lines = _step_lines()
    rng = random.Random(3)
    stream = [rng.choice([opener, opener + "\r", *lines, *lines[:4] * 100]).replace(".052", f".{i % 1000:03d}")
              for i in range(3_000)] + lines  # (a new stamp a line: an open record's prefix is not repeated)
    unknown = "(APIServer pid=9312) INFO 2026-11-25 12:39:15.052 [loggers.py:199] something else"
    stream += [line for step in lines for line in (unknown, step)]  # each after an open record with its prefix

    def run(shortcut: bool) -> tuple[str, str]:
        monkeypatch.setattr(parser, "_STEP_LINE", parser._step_line() if shortcut else None)
        health = SourceHealth("vllm_log")
        lp = parser.LogLineParser(health)
        out = [(repr(lp.parse_all(line, 1_795_610_355.5 + i)), lp._open_prefix, lp._continues)
               for i, line in enumerate(stream)]
        return repr(out), repr(health)

    fast, walk = run(True), run(False)
    assert fast == walk
    assert fast[0].count("EngineStep(") > 1_000


def test_known_lines_skip_comments_and_longer_names_but_keep_what_prometheus_reads() -> None:
    from attrib_agent.sources.metrics.parser import _known_lines

    body = ("# HELP vllm:num_requests_running Number of requests.\n# TYPE vllm:num_requests_running gauge\n"
            "vllm:num_requests_running{engine=\"0\"} 1.0\nvllm:num_requests_waiting_by_reason{r=\"x\"} 2.0\n"
            "vllm:num_requests_waiting\x0b\n \t# HELP vllm:kv_cache_usage_perc x\nx # HELP vllm:kv_cache_usage_perc 1\n"
            "  vllm:kv_cache_usage_perc 0.5\n# HELP  vllm:prompt_tokens_total 3\nvllm:prompt_tokens_total_x 4\n"
            "vllm:prompt_tokens_total 5")
    assert _known_lines(body) == ['vllm:num_requests_running{engine="0"} 1.0', "vllm:num_requests_waiting",
                                  "vllm:kv_cache_usage_perc 0.5", "vllm:prompt_tokens_total 5"]
    assert _known_lines("# TYPE vllm:num_requests_running gauge") == []
