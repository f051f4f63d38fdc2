"""vLLM's log line formats as data: prefixes, timestamps, the messages we read and those we must drop.

Each pattern below was read from vLLM 0.32's source (file named beside it); keeping them here, apart from
the parser's logic, makes a format change in a new vLLM a one-line diff. Nothing in this module keeps or
returns request content: helpers take a message and return only ids, numbers or fixed labels.
"""

from __future__ import annotations

import functools
import importlib
import re
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

# vllm/logging_utils/formatter.py ColoredFormatter wraps prefix parts in ANSI colours (VLLM_LOGGING_COLOR=1).
ANSI: Final = re.compile(r"\x1b\[[0-9;]*m")

# vllm/logger.py _FORMAT: `{VLLM_LOGGING_PREFIX}(%(vllm_process_name)s pid=%(process)d) %(levelname)s
# %(asctime)s [%(fileinfo)s:%(lineno)d] %(message)s`, _DATE_FORMAT `%m-%d %H:%M:%S`. Our lab/Helm format adds
# the year and `.%(msecs)03d`; Python's default asctime uses `,mmm`. The lead (VLLM_LOGGING_PREFIX, or a
# collector's own stamp) is bounded so a line full of parentheses cannot make the match quadratic.
PREFIX: Final = re.compile(
    r"(?P<lead>.{0,80}?)\((?P<proc>[^()\s]{1,64}) pid=(?P<pid>\d{1,10})\) (?P<level>[A-Z]{4,8}) "
    r"(?:(?P<year>\d{4})-)?(?P<month>\d\d)-(?P<day>\d\d) (?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d)"
    r"(?:[.,](?P<ms>\d{3}))? \[(?P<file>[^\]\s]{1,200}):(?P<lineno>\d{1,7})\] "
)

# vllm/logging_utils/formatter.py JSON_FORMAT via python-json-logger: asctime is logging's default
# `%Y-%m-%d %H:%M:%S,mmm` unless a config gives a datefmt (vLLM's own has no year); a `timestamp` key
# (ISO 8601) is used when a config adds one.
JSON_ASCTIME: Final = re.compile(
    r"(?:(?P<year>\d{4})-)?(?P<month>\d\d)-(?P<day>\d\d) (?P<hour>\d\d):(?P<minute>\d\d):(?P<second>\d\d)"
    r"(?:[.,](?P<ms>\d{3}))?"
)

_NUM = r"\d+(?:\.\d+)?"

# vllm/v1/metrics/loggers.py _log_iteration_details (--enable-logging-iteration-details). The device is
# `GPU` for cuda, else device_type.upper() (CPU, XPU, TPU ...).
ITERATION: Final = re.compile(
    r"Engine (?P<engine>\d{1,6}): Iteration\((?P<iteration>\d{1,18})\): (?P<ctx_reqs>\d{1,9}) context requests, "
    r"(?P<ctx_tokens>\d{1,12}) context tokens, (?P<gen_reqs>\d{1,9}) generation requests, "
    rf"(?P<gen_tokens>\d{{1,12}}) generation tokens, iteration elapsed time: (?P<elapsed>{_NUM}) ms"
    rf"(?P<dummy> \(dummy\))?, (?P<device>[A-Z]{{2,8}}) KV cache usage: (?P<kv>{_NUM})%"
    r"(?:, encoder inputs: \d+, encoder output embeddings: \d+)?"
)
ITERATION_LEAD: Final = re.compile(r"Engine \d+: Iteration\(")

# vllm/v1/metrics/loggers.py LoggingStatLogger.log: the two throughputs always, then optional parts
# (Running/Waiting, Deferred, KV fetch, Preemptions, `<DEV> KV cache usage`, Prefix cache hit rate, ...)
# that differ across versions; the parts are parsed one by one so a new part does not break the line.
# AggregatedLoggingStatLogger (data parallel) prints `N Engines Aggregated: ` instead of `Engine NNN: `.
STATS: Final = re.compile(
    rf"(?:Engine (?P<engine>\d{{1,6}})|(?P<aggregated>\d{{1,6}}) Engines Aggregated): Avg prompt throughput: "
    rf"(?P<prompt>{_NUM}) tokens/s, Avg generation throughput: (?P<generation>{_NUM}) tokens/s(?P<rest>(?:, .*)?)"
)
STATS_LEAD: Final = re.compile(r"(?:Engine \d+|\d+ Engines Aggregated): Avg prompt throughput")
STATS_RUNNING: Final = re.compile(r"Running: (\d{1,9}) reqs")
STATS_WAITING: Final = re.compile(r"Waiting: (\d{1,9}) reqs")
STATS_PREEMPTIONS: Final = re.compile(r"Preemptions: (\d{1,12})")
STATS_KV: Final = re.compile(rf"[A-Z]{{2,8}} KV cache usage: ({_NUM})%")
STATS_PREFIX_HIT: Final = re.compile(rf"Prefix cache hit rate: ({_NUM})%")

# vllm/config/scheduler.py SchedulerConfig.__post_init__ (INFO, once, at start-up in the API server process).
TOKEN_BUDGET: Final = re.compile(r"Chunked prefill is enabled with max_num_batched_tokens=(?P<budget>\d{1,9})\.")
TOKEN_BUDGET_LEAD: Final = re.compile(r"Chunked prefill is enabled with ")

# vllm/entrypoints/serve/utils/request_logger.py log_inputs (INFO). The params repr may hold user strings
# (stop words, bad_words, structured-output schemas): only the id and max_tokens are ever taken from it.
RECEIVED: Final = re.compile(r"Received request (?P<id>\S+): params: (?P<params>.*), lora_request: .*\.")
RECEIVED_LEAD: Final = re.compile(r"Received request ")

# vllm/v1/engine/async_llm.py: `Added request %s.` with the engine's internal id (its forms:
# attrib_agent/vllm_ids.py).
ADDED: Final = re.compile(r"Added request (?P<internal>\S+)\.")
ADDED_LEAD: Final = re.compile(r"Added request ")

# vllm/v1/engine/async_llm.py abort(): `Aborted request(s) %s.` with ",".join(ids) (internal ids when vLLM
# aborts on its own), and generate()'s `Request %s aborted.` (external id).
ABORTED_MANY: Final = re.compile(r"Aborted request\(s\) (?P<ids>\S+)\.")
ABORTED_MANY_LEAD: Final = re.compile(r"Aborted request\(s\) ")
ABORTED_ONE: Final = re.compile(r"Request (?P<id>\S+) aborted\.")

# vllm/v1/engine/async_llm.py generate()/encode() and entrypoints/generate/base/serving.py. The text after
# `failed` may quote the request (validation errors echo input): only a fixed label or a class name is kept.
FAILED: Final = re.compile(r"Request (?P<id>\S+) failed(?P<tail>.*)")
REQUEST_LEAD: Final = re.compile(r"Request \S+ (?:aborted|failed)")
_FAILURE_LABELS: Final = (
    (" (engine dead)", "engine_dead"),
    (" (bad request)", "bad_request"),
    (" (input error)", "input_error"),
    (" with an internal error", "internal_error"),
)
_FAILURE_CLASS: Final = re.compile(r" due to (?P<cls>[A-Za-z_][A-Za-z0-9_.]{0,63}):")

# Messages that carry prompt or completion text, checked before every other row and dropped uncounted
# beyond `content_dropped`. request_logger.py (DEBUG details and JSON body; --enable-log-outputs), the
# response-body middleware, and the Anthropic/Cohere front ends' DEBUG request dumps.
CONTENT: Final = (
    re.compile(r"Request \S+ details: "),
    re.compile(r"Request \S+ JSON body: "),
    re.compile(r"Generated response "),
    re.compile(r"response_body="),
    re.compile(r"Received messages request "),
    re.compile(r"Convert to OpenAI request "),
    re.compile(r"Received Cohere v2 chat request "),
    re.compile(r"Anthropic Messages Response: "),
)
# An unknown message mentioning any of these is counted as content too (tool/reasoning parsers log model
# output at DEBUG under many names). Either way the line is not kept; this only names the count.
CONTENT_HINT: Final = re.compile(
    r"prompt|output|JSON body|content|messages|response|delta_text|cur_text|model_output|tool_call", re.IGNORECASE
)


def failure_reason(tail: str) -> str:
    """A short label for what follows `Request <id> failed`: a fixed code or an exception class name."""
    for marker, label in _FAILURE_LABELS:
        if tail.startswith(marker):
            return label
    m = _FAILURE_CLASS.match(tail)
    if m:
        return m.group("cls")
    return "failed" if tail == "." else "other"


_PARAMS_SPECIAL: Final = re.compile(r"[\\'\"()\[\]{},]")  # the only characters top_level_int acts on


def top_level_int(params: str, name: str, limit: int = 65_536) -> int | None:
    """`name=<int>` among the top-level fields of a `Params(...)` repr, skipping quoted strings.

    A stop word such as `'max_tokens=5'` sits inside quotes and nested brackets, so it is never mistaken
    for the field. Returns None when the field is absent, `None`, or not an integer; scans at most `limit`
    characters (the tailer's line limit). Only quotes, brackets, commas and backslashes matter, so the scan
    jumps from one to the next (a regex) rather than stepping through every character.
    """
    if len(params) <= limit and "'" not in params and '"' not in params:
        return _unquoted_top_level_int(params, name)
    depth = 0
    quote = ""
    escaped_until = -1
    key = name + "="
    for hit in _PARAMS_SPECIAL.finditer(params, 0, min(len(params), limit)):
        i = hit.start()
        if i < escaped_until:
            continue
        c = params[i]
        if quote:
            if c == "\\":
                escaped_until = i + 2  # the next character is escaped, whatever it is
            elif c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
            if depth == 1 and c == "(" and params.startswith(key, i + 1):
                return _int_at(params, i + 1 + len(key))
        elif c in ")]}":
            depth -= 1
            if depth <= 0:
                return None
        elif depth == 1 and c == "," and params.startswith(" " + key, i + 1):
            return _int_at(params, i + 2 + len(key))
    return None


_BRACKETS: Final = re.compile(r"[()\[\]{}]")


def _unquoted_top_level_int(params: str, name: str) -> int | None:
    """`top_level_int` of params holding no quote (the usual `SamplingParams(...)`; no escape can matter): the
    places where `name=` follows `(` or `, ` are found by `str.find`, and only the brackets before them are read
    for the depth (not every comma: ~35 stops in a real repr, and no scan past the field)."""
    key = name + "="
    depth, pos = 0, 0
    while True:
        after_comma, after_open = params.find(", " + key, pos), params.find("(" + key, pos)
        at = after_open if after_comma < 0 or 0 <= after_open < after_comma else after_comma
        if at < 0:
            return None
        for hit in _BRACKETS.finditer(params, pos, at):
            if params[hit.start()] in "([{":
                depth += 1
            else:
                depth -= 1
                if depth <= 0:
                    return None
        if at == after_open:
            depth += 1
            if depth == 1:
                return _int_at(params, at + 1 + len(key))
        elif depth == 1:
            return _int_at(params, at + 2 + len(key))
        pos = at + 1


def _int_at(text: str, start: int) -> int | None:
    end = start
    while end < len(text) and end - start < 19 and text[end].isascii() and text[end].isdigit():
        end += 1
    if end == start or (end < len(text) and text[end] not in ",)"):
        return None
    return int(text[start:end])


_MS: Final = {f"{i:03d}": i / 1000 for i in range(1000)}  # a stamp's `.mmm` as seconds: int(mmm) / 1000


def prefix_log_ts(m: re.Match[str], receipt_ts: float) -> float | None:
    """Unix time of a prefix's (or JSON asctime's) stamp, read as UTC; None when it is not a real date.

    vLLM's default format has no year and one-second resolution: the year is the one (of the receipt
    year and its neighbours) that puts the stamp nearest the receipt time. vLLM prints local time; we
    assume its TZ is UTC (the Helm chart sets it), as we cannot know the server's zone.
    """
    year, ms_text = m.group("year", "ms")
    if year is not None:
        return dated_log_ts(m, ms_text)
    ms = stamp_ms(ms_text)
    try:
        receipt_year = datetime.fromtimestamp(receipt_ts, UTC).year
    except (OverflowError, OSError, ValueError):
        return None
    best: float | None = None
    for y in (receipt_year - 1, receipt_year, receipt_year + 1):
        t = _utc(y, m)
        if t is not None and (best is None or abs(t - receipt_ts) < abs(best - receipt_ts)):
            best = t
    return None if best is None else best + ms


def dated_log_ts(m: re.Match[str], ms_text: str | None) -> float | None:
    """`prefix_log_ts` of a match whose stamp has its year (`ms_text`: its `ms` group): one cached lookup a line."""
    t = _utc_dated(m.string[m.start("year"):m.end("second")])
    return None if t is None else t + stamp_ms(ms_text)


def stamp_ms(ms_text: str | None) -> float:
    """A stamp's `.mmm` group as seconds (0 without one)."""
    if not ms_text:
        return 0.0
    ms = _MS.get(ms_text, -1.0)
    return ms if ms >= 0 else int(ms_text) / 1000  # \d also matches non-ASCII digits


def _utc(year: int, m: re.Match[str]) -> float | None:
    return _utc_stamp(year, m.string[m.start("month"):m.end("second")])


@functools.lru_cache(maxsize=4096)
def _utc_dated(stamp: str) -> float | None:
    """`YYYY-MM-DD HH:MM:SS` as unix time (UTC), remembered whole (one lookup a line at GPU rates)."""
    return _utc_stamp(int(stamp[0:4]), stamp[5:])


@functools.lru_cache(maxsize=4096)
def _utc_stamp(year: int, stamp: str) -> float | None:
    """`MM-DD HH:MM:SS` of `year` as unix time (UTC). A log repeats each second's stamp on every line of that
    second (hundreds at GPU rates): remembered, not rebuilt through datetime each time."""
    try:
        d = datetime(year, int(stamp[0:2]), int(stamp[3:5]), int(stamp[6:8]), int(stamp[9:11]), int(stamp[12:14]),
                     tzinfo=UTC)
    except ValueError:
        return None
    return d.timestamp()


def json_log_ts(record: dict[str, object], receipt_ts: float) -> float | None:
    """Unix time of a python-json-logger record: `asctime` (read as UTC, like the text formats) or `timestamp`."""
    asctime = record.get("asctime")
    if isinstance(asctime, str):
        m = JSON_ASCTIME.fullmatch(asctime)
        if m:
            return prefix_log_ts(m, receipt_ts)
    stamp = record.get("timestamp")
    if isinstance(stamp, str) and len(stamp) <= 40:
        try:
            d = datetime.fromisoformat(stamp)
        except ValueError:
            return None
        return (d if d.tzinfo else d.replace(tzinfo=UTC)).timestamp()
    return None


def first_chars(pattern: re.Pattern[str]) -> frozenset[str] | None:
    """The characters a match of `pattern` can start with; None when any may (or this cannot tell).

    Lets the log parser try only the rows a message's first character allows (most messages then meet one
    regex, not the table), while the table stays the one place a format lives: read from the pattern itself.
    """
    if pattern.flags & re.IGNORECASE:
        return None
    try:
        parser: Any = importlib.import_module("re._parser")  # CPython's own regex parser (3.11+)
        return _first(parser.parse(pattern.pattern, pattern.flags))
    except Exception:  # another Python's internals: no dispatch, every row tried as before
        return None


def _first(items: Sequence[tuple[Any, Any]]) -> frozenset[str] | None:
    if not items:
        return None  # may match the empty string
    op, av = items[0]
    kind = str(op)
    if kind == "LITERAL":
        return frozenset(chr(av))
    if kind == "SUBPATTERN":  # (group, add flags, del flags, items)
        return None if av[1] or av[2] else _first(av[3])
    if kind == "BRANCH":
        found: set[str] = set()
        for alternative in av[1]:
            chars = _first(alternative)
            if chars is None:
                return None
            found |= chars
        return frozenset(found)
    return None
