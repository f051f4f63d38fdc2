"""vLLM log lines -> events: a table of (kind, pattern, builder) rows, content-bearing lines dropped first.

Why a table: vLLM's messages change between versions, and each row is one message we understand.
Why content first: vLLM may log prompts and outputs (DEBUG, --enable-log-outputs); those lines are only
counted (`content_dropped`), never kept, so no event, count label, log record or exception holds user text.

Accepted prefixes (see patterns.PREFIX): vLLM's default `(APIServer pid=N) INFO 11-22 00:29:19 [f.py:1] `
(no year, 1 s; read as UTC), the lab/Helm millisecond format with the year (UTC), either with ANSI colours or a
leading collector stamp, and vLLM's JSON formatter (python-json-logger, JSON_FORMAT) one object per line.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections import OrderedDict
from collections.abc import Callable
from typing import Final, NamedTuple, TypeVar

from attrib_agent.events import (
    EngineStep,
    RequestAborted,
    RequestAdded,
    RequestFailed,
    RequestReceived,
    StatsLine,
    TokenBudgetLine,
)
from attrib_agent.health import SourceHealth
from attrib_agent.sources.log import patterns as p
from attrib_agent.vllm_ids import CHILD_PREFIX, external_id

logger = logging.getLogger(__name__)

LogEvent = RequestReceived | RequestAdded | RequestAborted | RequestFailed | EngineStep | StatsLine | TokenBudgetLine
"""The events a vLLM log yields (a subset of attrib_agent.events.Event)."""

MAX_TRACKED_IDS: Final = 16_384
"""Requests in flight whose ids are remembered, at most (oldest first): the timeline holds 10,000 requests, so no
more in flight can be attributed. Reached only when spans never come (no OTLP, a restarted vLLM's lost ones)."""
MAX_JSON_LINE: Final = 1_048_576  # longer "JSON" lines are not decoded (the tailer cuts at 64 KiB anyway)
ADMIT_WINDOW_S: Final = 30.0
"""A received id whose `Added` line has not come this long after (event time) is forgotten (/tokenize ids never
reach the engine; vLLM logs the two lines within milliseconds). The same window as the timeline's book."""
MAX_RECEIVED: Final = 8_192  # received ids waiting for their `Added` line, at most (a /tokenize flood)
ENDED_GRACE_S: Final = 30.0
"""An ended request's ids stay mapped this long after its end (event time): a line read after its span (the log
tailer behind the OTLP receiver) still names the right request."""
MAX_ENDED: Final = 8_192  # ended requests kept for that grace, at most


class RequestIds:
    """Which external request an id vLLM logs names, remembered while a line can still name it: a received id
    until its `Added` line (or ADMIT_WINDOW_S), a request in flight from `Added` to its end (an abort or failure
    line, or its span via `ended`), and an ended one ENDED_GRACE_S more (late lines). An internal id
    (`<external>-<8 hex>`, `<i>_<external>-<8 hex>`) is resolved from the external ids held, never stored: the
    memory is sized by the requests in flight, not by how many went by. Each map has a hard bound, oldest first.

    An n>1 request's children (`<i>_<external>-<8 hex>`, parallel sampling) are vLLM's engine requests, each with
    its own sequence, KV blocks and span: each is named `<i>_<external>` and held in flight on its own; a line that
    names the parent (its abort) names every child of it still in flight."""

    def __init__(self, limit: int = MAX_TRACKED_IDS, *, max_received: int = MAX_RECEIVED,
                 max_ended: int = MAX_ENDED, admit_window_s: float = ADMIT_WINDOW_S,
                 grace_s: float = ENDED_GRACE_S) -> None:
        self.limit = limit
        self.max_received, self.max_ended = max_received, max_ended
        self.admit_window_s, self.grace_s = admit_window_s, grace_s
        self._received: OrderedDict[str, float] = OrderedDict()  # external id -> receipt time, not added yet
        self._live: OrderedDict[str, None] = OrderedDict()  # external ids in flight (added, not ended)
        self._ended: OrderedDict[str, float] = OrderedDict()  # external id -> when it ended, for the grace
        # n>1 parents (external id) -> their children's ids in flight, in index order (bounded like `_live`)
        self._children: OrderedDict[str, list[str]] = OrderedDict()
        # ids whose span landed before any log line named them (live, a span can beat the log's poll) -> spans not
        # yet given to a child: if `Added` lines then name children of it, the first ones take them. Held while
        # the id is in `_ended`'s grace (so bounded as it is).
        self._early: dict[str, int] = {}

    def __len__(self) -> int:
        return len(self._received) + len(self._live) + len(self._ended)

    def sizes(self) -> dict[str, int]:
        """Ids held by state: `received` (waiting for `Added`), `in_flight`, `ended` (in their grace). n>1 parents
        (`parents()`) name children held in flight, at most `limit` of them."""
        return {"received": len(self._received), "in_flight": len(self._live), "ended": len(self._ended)}

    def parents(self) -> int:
        """n>1 requests with a child still in flight."""
        return len(self._children)

    def received(self, request_id: str, ts: float) -> None:
        self._expire(ts)
        if request_id in self._live or request_id in self._ended:
            return
        self._received[request_id] = ts
        self._received.move_to_end(request_id)
        while len(self._received) > self.max_received:
            self._received.popitem(last=False)

    def added(self, internal_id: str) -> str:
        """The external id behind `internal_id`, now in flight (remembered for later aborts)."""
        external = self._resolve(internal_id, strip_unknown=True)
        self._received.pop(external, None)
        child = CHILD_PREFIX.fullmatch(external)
        if child and external not in self._ended and self._is_parent(parent := child.group("parent")):
            self._received.pop(parent, None)
            kids = self._children.setdefault(parent, [])
            self._children.move_to_end(parent)
            if external not in kids:
                kids.append(external)
            while len(self._children) > self.limit:
                self._children.popitem(last=False)
            if self._early.get(parent):  # one of its spans came before this line: this child's, ended
                self._early[parent] -= 1
                self.ended(external, self._ended.get(parent, 0.0))
        if external not in self._ended:  # its span came first (the log read late): in its grace already
            self._live[external] = None
            self._live.move_to_end(external)
            while len(self._live) > self.limit:
                self._live.popitem(last=False)
        return external

    def ended(self, request_id: str, ts: float) -> None:
        """`request_id` (external) ended: aborted, failed, or its span landed. Its ids stay mapped `grace_s` more."""
        self.child_ended(request_id)
        self._received.pop(request_id, None)
        self._live.pop(request_id, None)
        self._ended[request_id] = ts
        self._ended.move_to_end(request_id)
        self._expire(ts)
        while len(self._ended) > self.max_ended:
            self._early.pop(self._ended.popitem(last=False)[0], None)

    def span_landed(self, request_id: str, ts: float) -> None:
        """A span named `request_id` landed: it ends the request, or for an n>1 parent its first child still in
        flight; one that no log line named yet is kept for the children `Added` lines may name next."""
        target = self.requests(request_id, first=True)[0]
        if target == request_id and request_id not in self._live and (
                request_id not in self._ended or request_id in self._early):
            self._early[request_id] = self._early.get(request_id, 0) + 1
        self.ended(target, ts)

    def external(self, request_id: str) -> str:
        """The external id for an id vLLM logged (aborts may name the internal one)."""
        return self._resolve(request_id, strip_unknown=False)

    def requests(self, request_id: str, *, first: bool = False) -> list[str]:
        """The requests an id vLLM logged names: an n>1 parent's children still in flight (only the first with
        `first`), else its external id."""
        external = self._resolve(request_id, strip_unknown=False)
        kids = self._children.get(external)
        if not kids:
            return [external]
        return [kids[0]] if first else list(kids)

    def child_ended(self, request_id: str) -> None:
        """`request_id` (a child) left: its parent stops naming it."""
        child = CHILD_PREFIX.fullmatch(request_id)
        kids = self._children.get(child.group("parent")) if child else None
        if kids is not None and request_id in kids:
            kids.remove(request_id)
            if not kids:
                del self._children[child.group("parent")]  # type: ignore[union-attr]

    def _is_parent(self, request_id: str) -> bool:
        """Received and not added under its own id (an n>1 request's `Added` lines name only its children)."""
        return request_id in self._children or request_id in self._received or request_id in self._early

    def _known(self, request_id: str) -> bool:
        return (request_id in self._live or request_id in self._received or request_id in self._ended
                or request_id in self._children)

    def _resolve(self, request_id: str, *, strip_unknown: bool) -> str:
        """A held external id as is; else `<base>-<8 hex>` -> base (a child keeps its `<i>_`) when that is held; else,
        with `strip_unknown` (an `Added` line: its id is internal), the base; else the id itself."""
        if self._known(request_id):
            return request_id
        base = external_id(request_id)  # a child's own id (`<i>_<external>`): each child is a request here
        if base != request_id and (self._known(base) or strip_unknown):
            return base
        return request_id

    def _expire(self, now: float) -> None:
        received, ended = self._received, self._ended
        while received and now - next(iter(received.values())) > self.admit_window_s:
            received.popitem(last=False)
        while ended and now - next(iter(ended.values())) > self.grace_s:
            self._early.pop(ended.popitem(last=False)[0], None)


Builder = Callable[[re.Match[str], float, float | None, RequestIds], list[LogEvent]]


class Row(NamedTuple):
    kind: str
    pattern: re.Pattern[str]  # must match the whole message
    build: Builder


@functools.lru_cache(maxsize=4096)
def _fraction(percent: str) -> float:
    """vLLM prints `%.1f%%`; 0..1 rounded so 34.7% is 0.347, not 0.34700000000000003. Remembered: a log
    repeats the same few hundred percentages on every step line."""
    return round(float(percent) / 100, 6)


_ITERATION_GROUPS: Final = ("engine", "iteration", "ctx_reqs", "ctx_tokens", "gen_reqs", "gen_tokens", "elapsed",
                             "dummy", "device", "kv")
if tuple(p.ITERATION.groupindex) != _ITERATION_GROUPS:  # _engine_step unpacks the groups by position
    raise ImportError(f"patterns.ITERATION's groups changed: {tuple(p.ITERATION.groupindex)}")


def _step(groups: tuple[str, ...], ts: float, log_ts: float | None) -> EngineStep:
    # One line per engine step (~1,000 a second at GPU rates): the groups are read once, in ITERATION's order.
    engine, iteration, ctx_reqs, ctx_tokens, gen_reqs, gen_tokens, elapsed, dummy, device, kv = groups
    return EngineStep(ts, log_ts, int(engine), int(iteration), int(ctx_reqs), int(ctx_tokens), int(gen_reqs),
                      int(gen_tokens), float(elapsed), _fraction(kv), device, dummy is not None)


def _engine_step(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    return [_step(m.groups(), ts, log_ts)]


def _stats_line(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    parts = m["rest"].split(", ")

    def part(pattern: re.Pattern[str]) -> str | None:
        for text in parts:
            hit = pattern.fullmatch(text)
            if hit:
                return hit.group(1)
        return None

    running, waiting, preempt = part(p.STATS_RUNNING), part(p.STATS_WAITING), part(p.STATS_PREEMPTIONS)
    kv, hit_rate = part(p.STATS_KV), part(p.STATS_PREFIX_HIT)
    return [
        StatsLine(
            ts=ts, log_ts=log_ts, engine=-1 if m["engine"] is None else int(m["engine"]),
            prompt_throughput=float(m["prompt"]), generation_throughput=float(m["generation"]),
            running=None if running is None else int(running), waiting=None if waiting is None else int(waiting),
            kv_usage=None if kv is None else _fraction(kv),
            prefix_cache_hit_rate=None if hit_rate is None else _fraction(hit_rate),
            preemptions=None if preempt is None else int(preempt),
        )
    ]


def _received(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    ids.received(m["id"], ts)
    return [RequestReceived(ts=ts, log_ts=log_ts, request_id=m["id"],
                            max_tokens=p.top_level_int(m["params"], "max_tokens"))]


def _token_budget(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    return [TokenBudgetLine(ts=ts, log_ts=log_ts, token_budget=int(m["budget"]))]


def _added(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    internal = m["internal"]
    return [RequestAdded(ts=ts, log_ts=log_ts, request_id=ids.added(internal), internal_id=internal)]


def _ended(ids: RequestIds, request_id: str, ts: float) -> list[str]:
    """The requests that ended with this line (an n>1 parent's children in flight, else the one), their ids kept
    mapped for the grace."""
    gone = ids.requests(request_id)
    for external in gone:
        ids.ended(external, ts)
    return gone


def _aborted_many(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    return [RequestAborted(ts=ts, log_ts=log_ts, request_id=r) for i in m["ids"].split(",") if i
            for r in _ended(ids, i, ts)]


def _aborted_one(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    return [RequestAborted(ts=ts, log_ts=log_ts, request_id=r) for r in _ended(ids, m["id"], ts)]


def _failed(m: re.Match[str], ts: float, log_ts: float | None, ids: RequestIds) -> list[LogEvent]:
    reason = p.failure_reason(m["tail"])
    return [RequestFailed(ts=ts, log_ts=log_ts, request_id=r, reason=reason) for r in _ended(ids, m["id"], ts)]


# First match wins. Each row's lead says "this message was meant to be that kind": a line with the lead
# but not the whole pattern is counted as `malformed_<kind>` (a vLLM format change shows up there).
ROWS: Final[tuple[Row, ...]] = (
    Row("engine_step", p.ITERATION, _engine_step),
    Row("stats_line", p.STATS, _stats_line),
    Row("request_received", p.RECEIVED, _received),
    Row("request_added", p.ADDED, _added),
    Row("request_aborted", p.ABORTED_MANY, _aborted_many),
    Row("request_aborted", p.ABORTED_ONE, _aborted_one),
    Row("request_failed", p.FAILED, _failed),
    Row("token_budget", p.TOKEN_BUDGET, _token_budget),
)
LEADS: Final[tuple[tuple[str, re.Pattern[str]], ...]] = (
    ("engine_step", p.ITERATION_LEAD),
    ("stats_line", p.STATS_LEAD),
    ("request_received", p.RECEIVED_LEAD),
    ("request_added", p.ADDED_LEAD),
    ("request_aborted", p.ABORTED_MANY_LEAD),
    ("request", p.REQUEST_LEAD),
    ("token_budget", p.TOKEN_BUDGET_LEAD),
)
_CONTENT_ANY: Final = re.compile("|".join(f"(?:{c.pattern})" for c in p.CONTENT))
T = TypeVar("T")


def _by_first_char(entries: tuple[T, ...], pattern: Callable[[T], re.Pattern[str]]) -> dict[str, tuple[T, ...]]:
    """For each first character some entry's pattern needs, the entries (in table order) a message starting with
    it can match; a message starting with any other character can match only the entries under ""."""
    firsts = [p.first_chars(pattern(e)) for e in entries]
    chars = {c for f in firsts if f is not None for c in f} | {""}
    return {c: tuple(e for e, f in zip(entries, firsts, strict=True) if f is None or c in f) for c in chars}


_CONTENT_FIRST: Final = _by_first_char(p.CONTENT, lambda c: c)


def _step_line() -> re.Pattern[str] | None:
    """A step line with vLLM's own prefix and no lead (`(APIServer pid=N) INFO ... Engine 0: Iteration(...)`, ~99 %
    of a GPU server's log) as one regex: the prefix (lead empty) then the step row's message. None unless, for every
    first character a step message can have, no content pattern applies and the step row is the first row tried,
    so one match gives exactly what the table's walk gives (PREFIX's parts after the lead parse one way only)."""
    firsts = p.first_chars(p.ITERATION)
    rows = _by_first_char(ROWS, lambda row: row.pattern)
    if firsts is None or ROWS[0].build is not _engine_step or any(
            _CONTENT_FIRST.get(c) or _CONTENT_FIRST[""] or (rows.get(c) or rows[""])[0] is not ROWS[0] for c in firsts):
        return None
    lead = "(?P<lead>.{0,80}?)"
    if not p.PREFIX.pattern.startswith(lead):
        return None
    prefix = p.PREFIX.pattern[len(lead):]
    for name in ("proc", "pid", "level", "file", "lineno"):  # parts no step event reads: matched, not captured
        prefix = prefix.replace(f"(?P<{name}>", "(?:", 1)  # (the same language; ~0.15 us less a line)
    return re.compile("(?P<prefix>" + prefix + ")" + p.ITERATION.pattern)


_STEP_LINE: Final = _step_line()
# Positions in `_STEP_LINE.fullmatch(line).groups()` (one C call for every group a step line needs): the stamp's
# year and milliseconds, and the step row's groups, last, in ITERATION's order.
_AT: Final = {name: i - 1 for name, i in (_STEP_LINE.groupindex.items() if _STEP_LINE else ())}
_YEAR_AT: Final = _AT.get("year", -1)
_MS_AT: Final = _AT.get("ms", -1)
_ROW_AT: Final = _AT.get("engine", -1)
if _STEP_LINE is not None and tuple(_STEP_LINE.groupindex)[_ROW_AT:] != _ITERATION_GROUPS:
    raise ImportError("_STEP_LINE's last groups are not ITERATION's")


class LogLineParser:
    """Turns vLLM log lines into events; counts every line it does not turn into one, by kind.

    Stateful only to follow vLLM's multi-line records and map internal ids back (both bounded): vLLM's
    NewLineFormatter repeats the prefix on every continuation line and ends the line before it with "\\r".
    Continuation lines are never matched against the rows (a prompt containing "Added request ..." on its
    own line cannot become an event); when the "\\r" was lost (the lab recorder strips it), a line with
    exactly the prefix of an open record (content, unknown, or a failure with more text to come) counts
    as its continuation. Skip kinds: content_dropped, continuation, unknown_line, malformed_<kind>,
    malformed_json, parser_error.
    """

    def __init__(self, health: SourceHealth, *, max_tracked_ids: int = MAX_TRACKED_IDS) -> None:
        self.health = health
        self.ids = RequestIds(max_tracked_ids)
        self._continues = False  # the previous raw line ended in "\r": this one continues its record
        self._open_prefix: str | None = None  # prefix of the last record that may run on to more lines
        self._open_content = False  # ... and whether that record carries (or may carry) request content
        # A message meets only the rows its first character allows (one regex for a step line, not the table).
        self._rows = _by_first_char(ROWS, lambda row: row.pattern)
        self._leads = _by_first_char(LEADS, lambda lead: lead[1])

    def span_landed(self, request_id: str, ts: float) -> None:
        """`request_id`'s span was received at `ts`: it finished, so its ids are kept only for the grace after
        (the agent tells the parser; the log has no line for a normal finish). An n>1 request's children each
        have a span named by the parent: each ends the first child still in flight."""
        self.ids.span_landed(request_id, ts)

    def parse(self, line: str, ts: float) -> LogEvent | None:
        """The line's event, or None. Only `Aborted request(s) a,b` yields several: use parse_all for those."""
        events = self.parse_all(line, ts)
        if len(events) > 1:
            self.health.skip("events_beyond_first", len(events) - 1)
        return events[0] if events else None

    def parse_all(self, line: str, ts: float) -> list[LogEvent]:
        """Every event in one raw line (without its newline); `ts` is its receipt time. Never raises."""
        try:
            return self._parse(line, ts)
        except Exception as e:  # the boundary: a parser bug must not stop the source (no input in the report)
            self._open_prefix, self._open_content = None, False
            self.health.skip("parser_error")
            self.health.error("parser_error", ts, type(e).__name__)
            logger.warning("vLLM log parser failed on a line (%s); line dropped", type(e).__name__)
            return []

    def _parse(self, line: str, ts: float) -> list[LogEvent]:
        if line[:1] == "(" and not self._continues and _STEP_LINE is not None:
            m = _STEP_LINE.fullmatch(line)  # the common step line in one match; anything else the walk below reads
            if m is not None and "\x1b" not in line and (self._open_prefix is None
                                                          or m.group("prefix") != self._open_prefix):
                self._open_prefix, self._open_content = None, False
                self.health.success(ts)
                groups = m.groups()
                log_ts = p.prefix_log_ts(m, ts) if groups[_YEAR_AT] is None else p.dated_log_ts(m, groups[_MS_AT])
                return [_step(groups[_ROW_AT:], ts, log_ts)]
        continues, self._continues = self._continues, line.endswith("\r")
        text = line.rstrip("\r\n")
        if "\x1b" in text:
            text = p.ANSI.sub("", text)
        stripped = text.lstrip()
        if stripped.startswith("{"):
            self._open_prefix, self._open_content = None, False
            return self._parse_json(stripped, ts)
        m = p.PREFIX.match(text)
        if continues or (self._open_prefix is not None and m is not None and m.group(0) == self._open_prefix):
            self.health.skip("content_dropped" if self._open_content else "continuation")
            if m is not None:
                self._open_prefix = m.group(0)
            return []
        if m is None:
            self._unknown(text)
            return []
        events, is_open, self._open_content = self._message(text[m.end():], ts, p.prefix_log_ts(m, ts))
        self._open_prefix = m.group(0) if is_open else None
        return events

    def _parse_json(self, text: str, ts: float) -> list[LogEvent]:
        """One python-json-logger record; its message's later lines belong to it and are never matched."""
        try:
            record = json.loads(text) if len(text) <= MAX_JSON_LINE else None
        except (ValueError, RecursionError):
            record = None
        message = record.get("message") if isinstance(record, dict) else None
        if not isinstance(record, dict) or not isinstance(message, str):
            self.health.skip("malformed_json")
            return []
        first_line = message.split("\n", 1)[0].rstrip("\r")
        return self._message(first_line, ts, p.json_log_ts(record, ts))[0]

    def _message(self, msg: str, ts: float, log_ts: float | None) -> tuple[list[LogEvent], bool, bool]:
        """(events, may continue on the next line, carries content) for one message's first line."""
        first = msg[:1]
        if (first in _CONTENT_FIRST or _CONTENT_FIRST[""]) and _CONTENT_ANY.match(msg):
            self.health.skip("content_dropped")
            return [], True, True
        for row in self._rows.get(first) or self._rows[""]:
            m = row.pattern.fullmatch(msg)
            if m is None:
                continue
            events = row.build(m, ts, log_ts, self.ids)
            if not events:
                self.health.skip(f"malformed_{row.kind}")
            for _ in events:
                self.health.success(ts)
            if row.kind == "request_failed":  # an exception's text may run on, and may quote the request
                return events, not msg.endswith("."), True
            return events, False, False
        for kind, lead in self._leads.get(first) or self._leads[""]:
            if lead.match(msg):
                self.health.skip(f"malformed_{kind}")
                return [], True, False
        return [], True, self._unknown(msg)

    def _unknown(self, msg: str) -> bool:
        """Count a line no row knows; True when it looks like it carries request content."""
        content = p.CONTENT_HINT.search(msg) is not None
        self.health.skip("content_dropped" if content else "unknown_line")
        return content
