"""Request lifecycles from log lines and spans: partial while the request runs, complete when its span lands.

Live, a request is known from `Received`/`Added` long before vLLM exports its span (spans come only for
finished requests, seconds later). The book keeps those partial lifecycles and overwrites their times with
vLLM's own once the span lands. It is bounded: past `max_requests` the oldest ended request leaves first.

Only requests that entered the engine count: `Added request` (or a span) is the evidence. vLLM also logs
`Received request` for calls that never reach the engine (`/tokenize` and `/detokenize`, rejected or aborted
requests); such an id waits apart, bounded in number and in event time, and leaves without a trace if no
`Added` line comes: it never joins the queue the step inference reads, never holds a result, never shows.

An n>1 request (parallel sampling) is n engine requests in vLLM 0.32, its children `<i>_<id>` (the log parser
names them so): each has its own sequence, KV blocks and span, so each is a lifecycle here. They take the parent's
`Received` line (arrival, max_tokens, queue place); the parent's spans, all named by the parent's id, go to its
children one each, in child order.
"""

from __future__ import annotations

import bisect
from collections import OrderedDict
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from typing import Final

from attrib_agent.events import RequestAborted, RequestAdded, RequestFailed, RequestReceived, RequestSpan, quick_init
from attrib_agent.timeline.model import RequestLifecycle
from attrib_agent.vllm_ids import CHILD_PREFIX

RequestEvent = RequestReceived | RequestAdded | RequestAborted | RequestFailed | RequestSpan

NON_GENERATION_PREFIXES: Final = ("tokenize-",)
"""Ids vLLM logs `Received` for but never sends to the engine: /tokenize and /detokenize both use `tokenize-`
(vllm/entrypoints/serve/tokenize/serving.py). Anything else is judged by whether `Added request` follows."""
ADMIT_WINDOW_S: Final = 30.0
"""A `Received` id with no `Added` line or span this long after (event time) never entered the engine. vLLM
logs the two within milliseconds (serving -> AsyncLLM.add_request); the window only bounds memory."""
MAX_UNADMITTED: Final = 1024
"""At most this many received-not-added ids are held (a flood of /tokenize calls cannot grow the book)."""


def non_generation(request_id: str) -> bool:
    """An id of a call vLLM serves without its engine (no step, no KV, no span)."""
    return request_id.startswith(NON_GENERATION_PREFIXES)


@quick_init
@dataclass(frozen=True, slots=True)
class BookEntry:
    """A lifecycle plus what the timeline needs to order it: when it reached the queue and in which order."""

    lifecycle: RequestLifecycle
    queue_ts: float  # first time seen (Received log time, else span start): FCFS order, fixed once set
    order: int  # first-seen sequence number: tie-break for equal queue times


@quick_init
@dataclass(frozen=True, slots=True)
class BookChange:
    """What one event changed: the timeline re-infers the steps that the change can affect."""

    request_id: str
    new: bool  # the request entered the book's queue with this event (its first `Added` line or span)
    span_landed: bool  # this event completed the lifecycle (first span for it)
    aborted: bool


def _log_time(ev: RequestReceived | RequestAdded | RequestAborted | RequestFailed) -> float:
    return ev.log_ts if ev.log_ts is not None else ev.ts


class LifecycleBook:
    """Lifecycles by request id, with an index in queue order; duplicates and late or repeated spans are harmless."""

    def __init__(self, max_requests: int = 10_000, engine: int = 0, *, admit_window_s: float = ADMIT_WINDOW_S,
                 max_unadmitted: int = MAX_UNADMITTED) -> None:
        if max_requests < 1 or max_unadmitted < 1 or admit_window_s <= 0:
            raise ValueError("max_requests and max_unadmitted must be positive, admit_window_s > 0")
        self.max_requests = max_requests
        self.engine = engine
        self.admit_window_s = admit_window_s
        self.max_unadmitted = max_unadmitted
        self._entries: dict[str, BookEntry] = {}
        self._lifecycles: dict[str, RequestLifecycle] = {}  # the entries' lifecycles: the step inference's lookup
        self._queue: list[tuple[float, int, str]] = []  # (queue_ts, order, request_id), sorted
        self._queued: list[RequestLifecycle] = []  # the lifecycles in `_queue`'s order: `lifecycles()` is a copy
        self._open: dict[str, None] = {}  # ids of the queued lifecycles without a span yet (a few: the running)
        # received, not (yet) in the engine: id -> entry, in receipt order (expired from the front)
        self._unadmitted: OrderedDict[str, BookEntry] = OrderedDict()
        self._next_order = 0
        # n>1 parents -> (their `Received` entry, their children in the book in child order); bounded by the entries
        self._parents: dict[str, tuple[BookEntry | None, list[str]]] = {}
        self.last_span_request: str | None = None  # the lifecycle the last span fed went to (a child for n>1)
        self.evicted = 0
        self.non_generation = 0  # `Received` ids of calls that never use the engine (tokenize-...)
        self.never_admitted = 0  # received ids that left without an `Added` line or span (window, bound, abort)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, request_id: object) -> bool:
        return request_id in self._entries

    def get(self, request_id: str) -> RequestLifecycle | None:
        return self._lifecycles.get(request_id)

    def lookup(self) -> Callable[[str], RequestLifecycle | None]:
        """`get` as one C call (the step inference asks it for every request of every step it infers)."""
        return self._lifecycles.get

    def by_id(self) -> Mapping[str, RequestLifecycle]:
        """Every held lifecycle by id (what `lifecycles()` lists), live and read-only: for readers that look a few
        up, with no dict built over all of them."""
        return self._lifecycles

    def entry(self, request_id: str) -> BookEntry | None:
        return self._entries.get(request_id)

    def entries(self) -> list[BookEntry]:
        return list(self._entries.values())

    def unadmitted(self) -> int:
        """Received ids waiting for evidence that they entered the engine."""
        return len(self._unadmitted)

    def received(self, now: float) -> list[RequestLifecycle]:
        """The ids received and not yet in the engine at `now` (within the admit window), in receipt order: read
        by the forecast, for which a request vLLM's front end holds is ahead of a candidate sent after it."""
        since = now - self.admit_window_s
        return [e.lifecycle for e in self._unadmitted.values() if since <= e.queue_ts <= now]

    def lifecycles(self) -> list[RequestLifecycle]:
        """Every held lifecycle, in queue order: a copy of the list kept beside the queue (read at every settle;
        a walk of every entry cost ~1 ms a read at GPU rates)."""
        return self._queued.copy()

    def open_entries(self) -> list[BookEntry]:
        """The entries without a span (every one with no end is among them: a span brings the finish)."""
        return [self._entries[rid] for rid in self._open]

    def incomplete(self) -> list[tuple[int, RequestLifecycle]]:
        """(position in `lifecycles()`, lifecycle) of each held lifecycle without its span: the few a reader
        completes from the steps, found without a walk of every entry."""
        out = []
        for rid in self._open:
            entry = self._entries[rid]
            i = self._position(entry, rid)
            if i is not None:
                out.append((i, entry.lifecycle))
        return out

    def _position(self, entry: BookEntry, request_id: str) -> int | None:
        """Where the entry sits in `_queue` (and `_queued`), by bisection; None if it is not queued."""
        i = bisect.bisect_left(self._queue, (entry.queue_ts, entry.order, request_id))
        return i if i < len(self._queue) and self._queue[i][2] == request_id else None

    def queued_between(self, after: tuple[float, int] | None, before_ts: float) -> list[BookEntry]:
        """Entries whose (queue_ts, order) is past `after` and whose queue_ts is before `before_ts`, in order (a
        list: asked at every step inferred, where it is mostly empty)."""
        queue = self._queue
        i = 0 if after is None else bisect.bisect_right(queue, (after[0], after[1], "\uffff"))
        j, n = i, len(queue)
        while j < n and queue[j][0] < before_ts:
            j += 1
        return [self._entries[rid] for _, _, rid in queue[i:j]] if j > i else []

    def feed(self, ev: RequestEvent) -> BookChange:
        """Apply one request event; returns what changed so the caller can re-infer."""
        rid = ev.request_id
        if not isinstance(ev, RequestSpan):
            self.expire_unadmitted(_log_time(ev) - self.admit_window_s)
        elif rid in self._parents and rid not in self._entries:
            rid = self._span_child(rid)
            self.last_span_request = rid
            if not rid:  # more spans than children (a repeated export): nothing to change
                return BookChange(ev.request_id, new=False, span_landed=False, aborted=False)
        else:
            self.last_span_request = rid
        entry = self._entries.get(rid)
        new = entry is None
        if entry is None:
            waiting = self._unadmitted.get(rid)
            if waiting is None and isinstance(ev, RequestAdded):
                waiting = self._child_entry(rid)
            if isinstance(ev, RequestReceived):
                self._receive(ev, waiting)
                return BookChange(rid, new=False, span_landed=False, aborted=False)
            if not isinstance(ev, RequestAdded | RequestSpan):  # aborted or failed before it entered the engine
                if self._unadmitted.pop(rid, None) is not None:
                    self.never_admitted += 1
                return BookChange(rid, new=False, span_landed=False, aborted=False)
            entry = self._admit(rid, waiting, ev)
        lc = entry.lifecycle
        landed = False
        aborted = False
        if isinstance(ev, RequestSpan):
            landed = not lc.complete
            lc = _with_span(lc, ev)
        elif isinstance(ev, RequestReceived):
            if lc.arrival_ts is None:
                lc = replace(lc, arrival_ts=_log_time(ev))
            if ev.max_tokens is not None and lc.max_tokens is None:
                lc = replace(lc, max_tokens=ev.max_tokens)
        elif isinstance(ev, RequestAdded):
            if lc.arrival_ts is None:
                lc = replace(lc, arrival_ts=_log_time(ev))
        elif lc.aborted_ts is None and not lc.complete:  # aborted or failed: the request leaves, no span follows
            lc = replace(lc, aborted_ts=_log_time(ev))
            aborted = True
        if lc != entry.lifecycle:
            self._entries[rid] = replace(entry, lifecycle=lc)
            self._lifecycles[rid] = lc
            i = self._position(entry, rid)
            if i is not None:
                self._queued[i] = lc
            if lc.complete:
                self._open.pop(rid, None)
        if new:
            self._bound()
        return BookChange(rid, new=new, span_landed=landed, aborted=aborted)

    def _child_entry(self, rid: str) -> BookEntry | None:
        """For an n>1 child whose parent was received (or has children here): the parent's arrival, max_tokens
        and queue time, in a place of its own after its older siblings; None for any other id."""
        m = CHILD_PREFIX.fullmatch(rid)
        if m is None:
            return None
        parent = m.group("parent")
        got = self._parents.get(parent)
        received = got[0] if got is not None else self._unadmitted.pop(parent, None)
        if got is None and received is None:
            return None
        self._parents[parent] = (received, [*(got[1] if got else ()), rid])
        if received is None:
            return None
        self._next_order += 1
        return replace(received, lifecycle=replace(received.lifecycle, request_id=rid), order=self._next_order - 1)

    def _span_child(self, parent: str) -> str:
        """The child a span named by its n>1 parent belongs to: the first, in child order, with none yet ("" if
        all have one). vLLM's children of one request are alike (prompt, arrival, parameters), so which of two
        finishing together gets which span changes no step."""
        for child in self._parents[parent][1]:
            lc = self._lifecycles.get(child)
            if lc is not None and not lc.complete:
                return child
        return ""

    def client_of(self, request_id: str) -> str:
        """The client request `request_id` is part of: its n>1 parent while the book holds it as a child, else it."""
        if not self._parents or (m := CHILD_PREFIX.fullmatch(request_id)) is None:
            return request_id
        got = self._parents.get(m["parent"])
        return m["parent"] if got is not None and request_id in got[1] else request_id

    def clients(self) -> dict[str, str]:
        """Each n>1 child held -> its parent."""
        return {child: parent for parent, (_, kids) in self._parents.items() for child in kids}

    def children(self, parent: str) -> tuple[str, ...]:
        """An n>1 request's children in the book, in child order (empty for any other id)."""
        got = self._parents.get(parent)
        return tuple(got[1]) if got else ()

    def _receive(self, ev: RequestReceived, waiting: BookEntry | None) -> None:
        """A `Received` line alone: held apart until `Added` (or a span) shows the request entered the engine."""
        if non_generation(ev.request_id):
            self.non_generation += 1
            return
        if waiting is not None:
            return  # a repeated line
        lc = RequestLifecycle(request_id=ev.request_id, engine=self.engine, arrival_ts=_log_time(ev),
                              max_tokens=ev.max_tokens)
        self._unadmitted[ev.request_id] = BookEntry(lc, _log_time(ev), self._next_order)
        self._next_order += 1
        while len(self._unadmitted) > self.max_unadmitted:
            self._unadmitted.popitem(last=False)
            self.never_admitted += 1

    def _admit(self, rid: str, waiting: BookEntry | None, ev: RequestAdded | RequestSpan) -> BookEntry:
        """Into the queue, at the time it was received (FCFS order) when that line was seen, else now."""
        self._unadmitted.pop(rid, None)
        if waiting is None:
            first = ev.start_ts if isinstance(ev, RequestSpan) else _log_time(ev)
            waiting = BookEntry(RequestLifecycle(request_id=rid, engine=self.engine), first, self._next_order)
            self._next_order += 1
        self._entries[rid] = waiting
        self._lifecycles[rid] = waiting.lifecycle
        key = (waiting.queue_ts, waiting.order, rid)
        i = bisect.bisect_right(self._queue, key)
        self._queue.insert(i, key)
        self._queued.insert(i, waiting.lifecycle)
        if not waiting.lifecycle.complete:
            self._open[rid] = None
        return waiting

    def expire_unadmitted(self, before_ts: float) -> int:
        """Received ids first seen before `before_ts` that never entered the engine leave; returns how many."""
        n = 0
        while self._unadmitted:
            rid, entry = next(iter(self._unadmitted.items()))
            if entry.queue_ts >= before_ts:
                break
            del self._unadmitted[rid]
            n += 1
        self.never_admitted += n
        return n

    def forget(self, request_id: str) -> None:
        entry = self._entries.pop(request_id, None)
        self._lifecycles.pop(request_id, None)
        self._open.pop(request_id, None)
        i = None if entry is None else self._position(entry, request_id)
        if i is not None:
            del self._queue[i]
            del self._queued[i]
        if self._parents and (m := CHILD_PREFIX.fullmatch(request_id)) and (got := self._parents.get(m["parent"])):
            if request_id in got[1]:
                got[1].remove(request_id)
            if not got[1]:
                del self._parents[m["parent"]]

    def forget_ended_before(self, ts: float) -> int:
        """Drop requests that ended (finished or aborted) before `ts`; returns how many left."""
        gone = [rid for rid, e in self._entries.items() if (end := e.lifecycle.end_ts) is not None and end < ts]
        for rid in gone:
            self.forget(rid)
        return len(gone)

    def _bound(self) -> None:
        """Past the bound, the earliest-queued ended request leaves; if none has ended, the earliest-queued one."""
        while len(self._entries) > self.max_requests:
            victim = next((rid for _, _, rid in self._queue if self._entries[rid].lifecycle.end_ts is not None),
                          self._queue[0][2])
            self.forget(victim)
            self.evicted += 1


def _with_span(lc: RequestLifecycle, sp: RequestSpan) -> RequestLifecycle:
    """vLLM's own times: arrival is the span start, the others are offsets from it."""
    arrival = sp.start_ts

    def at(offset: float | None) -> float | None:
        return None if offset is None else arrival + offset

    return replace(
        lc,
        arrival_ts=arrival,
        scheduled_ts=at(sp.queue_s),
        first_token_ts=at(sp.ttft_s),
        finish_ts=at(sp.e2e_s) if sp.e2e_s is not None else sp.end_ts,
        prompt_tokens=sp.prompt_tokens,
        completion_tokens=sp.completion_tokens,
        max_tokens=sp.max_tokens if sp.max_tokens is not None else lc.max_tokens,
        prefill_s=sp.prefill_s,
        decode_s=sp.decode_s,
        aborted_ts=None,
        complete=True,
    )
