"""`attrib_agent.lab.playback` against a tiny fake receiver: a committed recording (canary, 5 s) played at 10x its
pace delivers every log line to the file, every OTLP export to the receiver byte for byte with its content
type, and serves the /metrics body due at the time of a scrape; a time shift moves every record alike."""

from __future__ import annotations

import asyncio
import base64
from pathlib import Path

import httpx
import pytest

from attrib_agent.lab.playback import (
    Delivery,
    LivePlayback,
    MetricsStandIn,
    WallClock,
    lateness_s,
    otlp_request_ids,
    read_streams,
    schedule,
    shift_for,
)
from attrib_agent.recording import LOG, METRICS, OTLP

RECORDING = Path(__file__).resolve().parents[1] / "fixtures" / "recordings" / "canary"
SPEED = 10.0


class FakeReceiver:
    """OTLP/HTTP stand-in: records (arrival time, path, content type, body) of every POST; answers 200."""

    def __init__(self, clock: WallClock) -> None:
        self.clock = clock
        self.got: list[tuple[float, str, str, bytes]] = []
        self.server: asyncio.Server | None = None

    async def start(self) -> str:
        self.server = await asyncio.start_server(self._handle, "127.0.0.1", 0)
        return f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}/v1/traces"

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    head = (await reader.readuntil(b"\r\n\r\n")).decode("latin-1").split("\r\n")
                except (asyncio.IncompleteReadError, ConnectionError):
                    return
                headers = {k.strip().lower(): v.strip() for k, _, v in (h.partition(":") for h in head[1:] if h)}
                body = await reader.readexactly(int(headers.get("content-length", "0")))
                self.got.append((self.clock.now(), head[0].split(" ")[1], headers.get("content-type", ""), body))
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        finally:
            writer.close()

    async def close(self) -> None:
        if self.server is not None:
            self.server.close()
            await self.server.wait_closed()


def test_schedule_shifts_every_record_by_whole_seconds() -> None:
    records = read_streams(RECORDING)
    first = min(float(r["ts"]) for rs in records.values() for r in rs)
    sched = schedule(records, first + 1000.4)
    assert sched.shift_s == shift_for(records, first + 1000.4) == 1001
    assert len(sched.due) == sum(len(rs) for rs in records.values())
    assert [d.at for d in sched.due] == sorted(d.at for d in sched.due)
    assert sched.start_ts == pytest.approx(first + 1001)
    lines = [d.record["line"] for d in sched.of(LOG)]
    assert lines == [r["line"] for r in records[LOG]]  # without a rewrite only delivery times move


def test_plays_a_recording_into_a_fake_receiver(tmp_path: Path) -> None:
    records = read_streams(RECORDING)
    assert records[OTLP] and records[LOG] and records[METRICS]

    async def main() -> tuple[list[Delivery], FakeReceiver, list[tuple[float, bytes]], float]:
        clock = WallClock()
        rx = FakeReceiver(clock)
        url = await rx.start()
        standin = MetricsStandIn(clock)
        base = await standin.start()
        sched = schedule(records, clock.now() + 0.2, speed=SPEED)
        scrapes: list[tuple[float, bytes]] = []
        heard: list[Delivery] = []

        async def scrape() -> None:
            async with httpx.AsyncClient(trust_env=False) as c:
                while clock.now() < sched.end_ts:
                    t = clock.now()
                    resp = await c.get(f"{base}/metrics")
                    assert resp.status_code == 200
                    scrapes.append((t, resp.content))
                    await asyncio.sleep(0.05)
                assert (await c.get(f"{base}/other")).status_code == 404

        player = LivePlayback(log_path=tmp_path / "vllm.log", otlp_url=url, metrics=standin, clock=clock,
                              on_delivery=heard.append)
        got, _ = await asyncio.wait_for(asyncio.gather(player.play(sched), scrape()), 30)
        assert heard and len(heard) == len(got)
        await standin.close()
        await rx.close()
        return got, rx, scrapes, sched.start_ts

    got, rx, scrapes, start = asyncio.run(main())
    # the log: every line, in order, nothing else
    assert (tmp_path / "vllm.log").read_text().splitlines() == [r["line"] for r in records[LOG]]
    # OTLP: every export byte for byte, recorded content type, and on time (10x pace)
    assert [(path, ctype, body) for _, path, ctype, body in rx.got] == [
        ("/v1/traces", r["content_type"], base64.b64decode(r["body_b64"])) for r in records[OTLP]]
    first = min(float(r["ts"]) for rs in records.values() for r in rs)
    for (arrived, *_), rec in zip(rx.got, records[OTLP], strict=True):
        assert arrived >= start + (float(rec["ts"]) - first) / SPEED - 0.01
    otlp = [d for d in got if d.stream == OTLP]
    assert all(d.status == 200 for d in otlp)
    assert [d.request_ids for d in otlp] == [otlp_request_ids(r) for r in records[OTLP]]
    # every canary request's span delivered (vLLM's start-up spans may come in exports of their own, with no ids)
    assert sum(len(d.request_ids) for d in otlp) == 4
    assert lateness_s(got) < 1.0  # (a loaded machine may be late; the benchmark reports it)
    # /metrics: each scrape got a recorded body, the one due by then (or the one just before: scheduling)
    bodies = [str(r["text"]).encode() for r in records[METRICS]]
    dues = [start + (float(r["ts"]) - first) / SPEED for r in records[METRICS]]
    assert scrapes
    for t, body in scrapes:
        assert body in bodies
        k = bodies.index(body)
        assert k == 0 or dues[k] <= t + 0.2
