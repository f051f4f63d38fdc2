"""Play a recording live, at its recorded pace, into a running agent: as if vLLM were beside it now.

A recording holds what a sidecar received and when. Replaying it through `ReplaySource` tests the pipeline;
playing it *live* tests the running agent as deployed (its log follower, /metrics poller, OTLP receiver,
queue, settle timing and API), which is what a freshness or overhead measurement needs. Each input goes the
way vLLM's would:

- `/metrics`: a stand-in HTTP server (`MetricsStandIn`) that the agent scrapes like vLLM; a scrape at time t
  gets the last body vLLM had served by t in the recording, byte for byte;
- the log: each recorded line appended to a file the agent follows (`--log-file`), at its receipt time;
- OTLP: each recorded export POSTed to the agent's OTLP/HTTP receiver at its receipt time, raw bytes and
  recorded content type and encoding.

Times. The agent stamps what it receives with its own clock, but also reads vLLM's stamps in log lines and
the span start/end times inside OTLP bodies; the timeline mixes both (step ends from log stamps, KV samples
from receipt times, victims' finish times from spans). Played days after it was made, a recording's stamps
would all lie in the past of the receipt times and nothing would line up, so the records are first moved to
*now*: `shift_for` picks a whole number of seconds (millisecond stamps stay exact) and the caller's
`rewrite(shift)` moves every time the records hold (`lab.recording_copy.CopyRewrite` does: log prefixes,
span times, request ids per copy). Without a rewrite only the delivery times move.

Everything here is bounded: each delivery is due at a fixed time, a late delivery is sent at once (its
lateness is kept, so a measurement can say whether the player kept pace), every POST has a time-out, and the
stand-in serves only GET /metrics on loopback.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from attrib_agent.events import RequestSpan
from attrib_agent.lab.client import Clock
from attrib_agent.recording import LOG, METRICS, OTLP, Recording
from attrib_agent.sources.otlp.decode import OtlpError, decode_export

PLAYED_STREAMS: Final = (METRICS, LOG, OTLP)  # NVML samples have no wire format a sidecar receives
METRICS_CONTENT_TYPE: Final = "text/plain; version=0.0.4; charset=utf-8"  # what vLLM's prometheus_client serves
POST_TIMEOUT_S: Final = 10.0
MAX_DECOMPRESSED: Final = 64 * 2**20
_MAX_HEADER_BYTES: Final = 16 * 1024

Record = dict[str, Any]
RecordRewrite = Callable[[str, Mapping[str, Any]], Record]  # (stream, record) -> the record moved in time


class PlaybackError(Exception):
    """A recording that cannot be played (nothing to play, a stream it cannot send)."""


def read_streams(recording: str | os.PathLike[str] | Recording) -> dict[str, list[Record]]:
    """The played streams of a recording directory, in file order."""
    rec = recording if isinstance(recording, Recording) else Recording(recording)
    return {s: list(rec.records(s)) for s in PLAYED_STREAMS}


def shift_for(records: Mapping[str, Sequence[Mapping[str, Any]]], start_at: float) -> int:
    """Whole seconds to add to the recorded times so that the first record falls at or just after `start_at`."""
    stamps = [float(r["ts"]) for rs in records.values() for r in rs]
    if not stamps:
        raise PlaybackError("the recording has nothing to play")
    return math.ceil(start_at - min(stamps))


@dataclass(frozen=True)
class Due:
    """One record and the wall time (unix seconds) it is due."""

    at: float
    stream: str
    record: Mapping[str, Any]


@dataclass(frozen=True)
class Delivery:
    """What was delivered when: `sent_ts - due_ts` is the player's own lateness."""

    stream: str
    due_ts: float
    sent_ts: float
    done_ts: float
    status: int | None = None  # the receiver's HTTP status (OTLP); None for log lines and metrics bodies
    error: str | None = None
    request_ids: tuple[str, ...] = ()  # OTLP: vLLM request ids of the export's `llm_request` spans
    lines: int = 0  # log: lines written in this delivery


@dataclass
class Schedule:
    """A recording moved to now: its records with the wall time each is due, in time order."""

    shift_s: int
    start_ts: float  # when the first record is due
    end_ts: float  # when the last one is
    due: list[Due] = field(default_factory=list)

    def of(self, stream: str) -> list[Due]:
        return [d for d in self.due if d.stream == stream]


def schedule(records: Mapping[str, Sequence[Mapping[str, Any]]], start_at: float,
             rewrite: Callable[[int], RecordRewrite] | None = None, *, speed: float = 1.0) -> Schedule:
    """The records moved (by `rewrite(shift)`, when given) so the first is due at or just after `start_at`.

    At `speed` 1 a record is due at its own (shifted) receipt time, so the agent's receipt stamps and the
    moved stamps inside the records agree. Another speed compresses the deliveries only (for tests): the
    stamps inside the records then no longer match when they arrive.
    """
    if not speed > 0 or math.isinf(speed):
        raise ValueError(f"speed must be a finite number > 0, got {speed!r}")
    shift = shift_for(records, start_at)
    move = rewrite(shift) if rewrite is not None else None
    due: list[Due] = []
    for stream in PLAYED_STREAMS:
        for rec in records.get(stream, ()):
            moved = move(stream, rec) if move is not None else {**rec, "ts": float(rec["ts"]) + shift}
            due.append(Due(float(moved["ts"]), stream, moved))
    due.sort(key=lambda d: d.at)  # (stable: records of one time keep their stream's file order)
    first = due[0].at
    if speed != 1.0:
        due = [Due(first + (d.at - first) / speed, d.stream, d.record) for d in due]
    return Schedule(shift, first, due[-1].at, due)


class WallClock(Clock):
    """The load client's clock (unix time from the monotonic clock, anchored once, so a wall-clock step cannot
    bend a playback) that can also sleep until a time."""

    async def sleep_until(self, ts: float) -> None:
        delay = ts - self.now()
        if delay > 0:
            await asyncio.sleep(delay)


class MetricsStandIn:
    """vLLM's /metrics as a recording served it: `add` timed bodies; a scrape gets the latest one due.

    Before the first body is due the first one is served (vLLM was up, idle), after the last the last one
    (it stays up between recordings). Only `GET /metrics` on loopback; keep-alive, like vLLM's server.
    """

    def __init__(self, clock: WallClock | None = None) -> None:
        self.clock = clock or WallClock()
        self._bodies: list[tuple[float, bytes]] = []  # (due wall ts, body), in time order
        self._server: asyncio.Server | None = None
        self.scrapes = 0
        self.url = ""

    def add(self, due: Iterable[Due]) -> int:
        """Serve these /metrics records at their due times (records of other streams are ignored)."""
        new = [(d.at, str(d.record["text"]).encode("utf-8")) for d in due if d.stream == METRICS]
        self._bodies = sorted(self._bodies + new, key=lambda b: b[0])
        return len(new)

    def body_at(self, ts: float) -> bytes | None:
        body = self._bodies[0][1] if self._bodies else None
        for at, b in self._bodies:  # (a recording holds a few hundred bodies: a scan is cheap enough)
            if at > ts:
                break
            body = b
        return body

    async def start(self, host: str = "127.0.0.1", port: int = 0) -> str:
        """Listen; returns the base URL to give the agent as `--vllm-url`."""
        self._server = await asyncio.start_server(self._handle, host, port)
        sock_port = self._server.sockets[0].getsockname()[1]
        self.url = f"http://{host}:{sock_port}"
        return self.url

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._server.wait_closed(), 5.0)
            self._server = None

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = await reader.readuntil(b"\r\n\r\n")
                except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
                    return
                if len(head) > _MAX_HEADER_BYTES:
                    return
                lines = head.decode("latin-1").split("\r\n")
                parts = lines[0].split(" ")
                close = any(ln.lower().replace(" ", "") == "connection:close" for ln in lines[1:])
                body = self.body_at(self.clock.now()) if len(parts) == 3 and parts[0] == "GET" and \
                    parts[1].split("?")[0] == "/metrics" else None
                if body is None:
                    writer.write(b"HTTP/1.1 404 Not Found\r\nContent-Length: 0\r\n\r\n")
                else:
                    self.scrapes += 1
                    writer.write(f"HTTP/1.1 200 OK\r\nContent-Type: {METRICS_CONTENT_TYPE}\r\n"
                                 f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
                await writer.drain()
                if close:
                    return
        finally:
            writer.close()


def otlp_spans(record: Mapping[str, Any]) -> tuple[RequestSpan, ...]:
    """The `llm_request` spans in a recorded OTLP export, decoded as the agent's receiver decodes them."""
    try:
        got = decode_export(base64.b64decode(record["body_b64"]), content_type=record.get("content_type"),
                            content_encoding=record.get("content_encoding"), ts=float(record["ts"]),
                            max_decompressed=MAX_DECOMPRESSED)
    except (OtlpError, ValueError):
        return ()
    return got.spans


def otlp_request_ids(record: Mapping[str, Any]) -> tuple[str, ...]:
    """vLLM request ids of the `llm_request` spans in a recorded OTLP export (what the agent will attribute)."""
    return tuple(s.request_id for s in otlp_spans(record))


class LivePlayback:
    """Delivers scheduled records to a running agent: log lines to `log_path`, OTLP exports to `otlp_url`,
    /metrics bodies to `metrics` (which the agent scrapes). `on_delivery` hears of each delivery as it is
    done (the freshness benchmark starts asking the API for an export's requests there)."""

    def __init__(self, *, log_path: str | os.PathLike[str] | None, otlp_url: str | None,
                 metrics: MetricsStandIn | None, clock: WallClock | None = None,
                 on_delivery: Callable[[Delivery], None] | None = None,
                 client: httpx.AsyncClient | None = None) -> None:
        self.log_path = None if log_path is None else Path(log_path)
        self.otlp_url = otlp_url
        self.metrics = metrics
        self.clock = clock or (metrics.clock if metrics is not None else WallClock())
        self.on_delivery = on_delivery
        self._client = client
        self.deliveries: list[Delivery] = []

    async def play(self, sched: Schedule) -> list[Delivery]:
        """Deliver every record of `sched` at its time; returns when the last one is delivered."""
        if self.metrics is not None:
            self.metrics.add(sched.of(METRICS))
        elif sched.of(METRICS):
            raise PlaybackError("the recording has /metrics bodies but no stand-in serves them")
        if sched.of(OTLP) and self.otlp_url is None:
            raise PlaybackError("the recording has OTLP exports but no receiver URL was given")
        if sched.of(LOG) and self.log_path is None:
            raise PlaybackError("the recording has log lines but no log file was given")
        own = self._client is None
        client = self._client or httpx.AsyncClient(trust_env=False, timeout=POST_TIMEOUT_S)
        out: list[Delivery] = []
        try:
            # One task per stream: a slow POST must not hold back the log lines due meanwhile.
            await asyncio.gather(self._log(sched.of(LOG), out), self._otlp(sched.of(OTLP), client, out),
                                 self._metrics_served(sched.of(METRICS), out))
        finally:
            if own:
                await client.aclose()
        out.sort(key=lambda d: d.due_ts)
        self.deliveries += out
        return out

    def _done(self, d: Delivery, out: list[Delivery]) -> None:
        out.append(d)
        if self.on_delivery is not None:
            self.on_delivery(d)

    async def _log(self, due: list[Due], out: list[Delivery]) -> None:
        if not due or self.log_path is None:
            return
        with self.log_path.open("ab") as f:
            i = 0
            while i < len(due):
                at = due[i].at
                await self.clock.sleep_until(at)
                sent = self.clock.now()
                j = i
                while j < len(due) and due[j].at <= sent:  # every line due by now, in one write (as vLLM's
                    j += 1                                   # logging flushes a burst of lines together)
                f.write("".join(str(d.record["line"]) + "\n" for d in due[i:j]).encode("utf-8"))
                f.flush()
                self._done(Delivery(LOG, at, sent, self.clock.now(), lines=j - i), out)
                i = j

    async def _otlp(self, due: list[Due], client: httpx.AsyncClient, out: list[Delivery]) -> None:
        if not due or self.otlp_url is None:
            return
        for d in due:
            rec = d.record
            body = base64.b64decode(rec["body_b64"])
            headers = {"Content-Type": str(rec.get("content_type") or "application/x-protobuf")}
            if rec.get("content_encoding"):
                headers["Content-Encoding"] = str(rec["content_encoding"])
            ids = otlp_request_ids(rec)
            await self.clock.sleep_until(d.at)
            sent = self.clock.now()
            status: int | None = None
            error: str | None = None
            try:
                resp = await client.post(self.otlp_url, content=body, headers=headers, timeout=POST_TIMEOUT_S)
                status = resp.status_code
            except httpx.HTTPError as e:
                error = f"{type(e).__name__}: {e}"[:200]
            self._done(Delivery(OTLP, d.at, sent, self.clock.now(), status=status, error=error, request_ids=ids), out)

    async def _metrics_served(self, due: list[Due], out: list[Delivery]) -> None:
        """A /metrics body is 'delivered' when it becomes the one served (the agent scrapes it when it will)."""
        for d in due:
            await self.clock.sleep_until(d.at)
            now = self.clock.now()
            self._done(Delivery(METRICS, d.at, now, now), out)


def lateness_s(deliveries: Iterable[Delivery]) -> float:
    """The player's worst lateness: how long after its due time a delivery started."""
    return max((d.sent_ts - d.due_ts for d in deliveries), default=0.0)


def process_cpu_s(pid: int) -> float:
    """CPU seconds (user + system) a process has used so far, from /proc (Linux); NaN elsewhere."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return float("nan")
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
