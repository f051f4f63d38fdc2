"""The lab's load client: streams completions on a fixed schedule and times every token.

Runs in its own process (`python -m attrib_agent.lab.client PLAN OUT`), at a higher scheduling
priority than vLLM where allowed, because on a 2-core machine vLLM can starve it for seconds. TTFT and
gaps are measured from the *intended* send time (no coordinated omission), and the client's own
lateness (send lag, event-loop heartbeat lateness) is recorded so a late run can be rejected.

Requests planned for the same instant (or closer than `TIE_GAP_S`) are sent in the plan's order (`send_slots`); in a
tie with a whale, each one `TIE_GAP_S` after the one before it and not before that one's response head arrived: a
counterfactual truth must change only the whales present, not which of two tied requests reaches vLLM first.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import hashlib
import json
import os
import re
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

HEARTBEAT_S = 0.010
# Sends tied with a whale are spaced by this much, in the plan's order. Spacing alone does not fix the order: vLLM's
# API server parses a 5,000-token body ~0.7 ms slower than a short's, so a whale sent 1 ms first reached it 0.3 ms
# first. The order is fixed by waiting for the earlier one's response head: vLLM's API server writes it after logging
# "Received request" and just before it hands the request to its engine (no I/O wait between them for token ids).
TIE_GAP_S = 0.001
HEAD_WAIT_MAX_S = 1.0  # past this the tied request goes anyway; its send lag shows the wait and rejects the run


@dataclass(frozen=True)
class PlannedRequest:
    spec_id: str
    klass: str
    is_whale: bool
    request_id: str  # sent as X-Request-Id; vLLM reports cmpl-<request_id>-0
    offset_s: float
    prompt_token_ids: list[int]
    max_tokens: int
    api: str = "completions"  # "completions" (token ids), "text" or "chat"
    prompt_text: str | None = None
    # The run's privacy canary, for text prompts: vLLM is made to generate it (structured output) and carries it
    # in its span (W3C tracestate), so a privacy test finds it in vLLM's output log lines and OTLP bodies too.
    canary: str | None = None
    n: int = 1  # parallel sampling: vLLM runs n child sequences of `max_tokens` each for this one request


@dataclass
class ClientResult:
    """One line of client.jsonl. Times are unix seconds derived from one monotonic clock."""

    id: str
    spec_id: str
    klass: str
    is_whale: bool
    vllm_request_id: str | None
    intended_send_ts: float
    response_id: str | None = None
    actual_send_ts: float | None = None
    first_token_ts: float | None = None
    token_ts: list[float] = field(default_factory=list)
    finish_ts: float | None = None
    prompt_tokens: int = 0
    output_tokens: int = 0
    max_tokens: int = 0
    n: int = 1  # sequences asked for; output_tokens sums them (the final usage chunk's total)
    status: str = "pending"
    error: str | None = None
    send_seq: int | None = None  # this run's send order (0 first): a truth checks tied requests kept theirs
    send_after: str | None = None  # spec id of the tied request sent just before this one (see `SendSlot`)
    head_ts: float | None = None  # when the response head (status line and headers) arrived

    @property
    def send_lag_s(self) -> float | None:
        return None if self.actual_send_ts is None else self.actual_send_ts - self.intended_send_ts


class Clock:
    """Unix time from the monotonic clock, anchored once, so a wall-clock step cannot bend a run."""

    def __init__(self) -> None:
        self._wall0 = time.time()
        self._mono0 = time.monotonic()

    def now(self) -> float:
        return self._wall0 + (time.monotonic() - self._mono0)

    def mono_at(self, wall_ts: float) -> float:
        return self._mono0 + (wall_ts - self._wall0)


@dataclass(frozen=True)
class SendSlot:
    """When a planned request is sent: its offset after tie spacing and the tied request (plan index) it follows:
    after that one's response head in a tie with a whale (`head`), else as soon as that one was sent."""

    offset_s: float
    after: int | None = None
    head: bool = False


def send_slots(plan: Sequence[PlannedRequest], gap_s: float = TIE_GAP_S) -> list[SendSlot]:
    """Chain requests planned less than `gap_s` after the previous send in the plan's order; one tied with a whale
    (either side) goes `gap_s` after the previous one and waits for its response head.

    The plan's order within a tie is the scenario's (offset, spec id) order, and a condition only drops whales, so
    two tied requests go in the same order in every condition. Ties of shorts only (present in every condition,
    e.g. `marginal`'s bursts) are not spaced: chained by their sends alone they still reach vLLM together.
    Pure: the same plan always gives the same slots."""
    slots: list[SendSlot] = [SendSlot(r.offset_s) for r in plan]
    prev: int | None = None
    for i in sorted(range(len(plan)), key=lambda k: plan[k].offset_s):  # stable: a tie keeps the plan's order
        if prev is not None and plan[i].offset_s < slots[prev].offset_s + gap_s:
            if plan[i].is_whale or plan[prev].is_whale:
                slots[i] = SendSlot(round(slots[prev].offset_s + gap_s, 9), prev, head=True)
            else:
                slots[i] = SendSlot(max(plan[i].offset_s, slots[prev].offset_s), prev)
        prev = i
    return slots


def canary_headers(canary: str, request_id: str) -> dict[str, str]:
    """A W3C trace context whose tracestate holds the canary: vLLM puts it in its llm_request span."""
    h = hashlib.sha256(request_id.encode()).hexdigest()
    return {"traceparent": f"00-{h[:32]}-{h[32:48]}-01", "tracestate": f"lab={canary}"}


def parse_sse_line(line: str) -> dict[str, Any] | None:
    """One `data: {...}` line of an OpenAI-style stream; None for keep-alives and `[DONE]`."""
    if not line.startswith("data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == "[DONE]":
        return None
    obj = json.loads(payload)
    return obj if isinstance(obj, dict) else None


async def _heartbeat(stop: asyncio.Event, clock: Clock, samples: list[tuple[float, float]]) -> None:
    """(unix time, lateness) every 10 ms: how late the event loop wakes is how late our stamps are."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        due = loop.time() + HEARTBEAT_S
        await asyncio.sleep(HEARTBEAT_S)
        samples.append((clock.now(), max(0.0, loop.time() - due)))


@dataclass
class SendOrder:
    """The run's shared send state: a counter for `send_seq` and per request an event set when it is sent and one
    set at its response head."""

    sent: list[asyncio.Event]
    heads: list[asyncio.Event]
    next_seq: int = 0

    @classmethod
    def for_plan(cls, n: int) -> SendOrder:
        return cls([asyncio.Event() for _ in range(n)], [asyncio.Event() for _ in range(n)])


async def _one(
    client: httpx.AsyncClient, base_url: str, model: str, req: PlannedRequest, start_ts: float, clock: Clock,
    slot: SendSlot | None = None, order: SendOrder | None = None, index: int = 0, after_spec: str | None = None,
) -> ClientResult:
    slot = slot or SendSlot(req.offset_s)
    res = ClientResult(
        id=req.request_id,
        spec_id=req.spec_id,
        klass=req.klass,
        is_whale=req.is_whale,
        vllm_request_id=None,
        intended_send_ts=start_ts + slot.offset_s,
        prompt_tokens=len(req.prompt_token_ids),
        max_tokens=req.max_tokens,
        n=req.n,
    )
    delay = clock.mono_at(res.intended_send_ts) - time.monotonic()
    if delay > 0:
        await asyncio.sleep(delay)
    body: dict[str, Any] = {
        "model": model,
        "max_tokens": req.max_tokens,
        "ignore_eos": True,
        "temperature": 0.0,
        "stream": True,
        "stream_options": {"include_usage": True, "continuous_usage_stats": True},
    }
    if req.n > 1:  # vLLM refuses n > 1 with greedy sampling; seeded, so a rerun samples the same (child i: seed + i)
        body.update(n=req.n, temperature=1.0, seed=int(hashlib.sha256(req.request_id.encode()).hexdigest()[:8], 16))
    path = "/v1/completions"
    if req.api == "chat":
        path = "/v1/chat/completions"
        body["messages"] = [{"role": "user", "content": req.prompt_text or ""}]
    elif req.api == "text":
        body["prompt"] = req.prompt_text or ""
    else:
        body["prompt"] = req.prompt_token_ids
    headers = {"X-Request-Id": req.request_id}
    if req.canary:
        headers.update(canary_headers(req.canary, req.request_id))
        body["structured_outputs"] = {"regex": re.escape(req.canary) + " [a-z ]*"}
    if order is not None and slot.after is not None:
        res.send_after = after_spec
        ready = (order.heads if slot.head else order.sent)[slot.after]
        if not ready.is_set():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(ready.wait(), HEAD_WAIT_MAX_S)
    res.actual_send_ts = clock.now()
    if order is not None:
        res.send_seq, order.next_seq = order.next_seq, order.next_seq + 1
        order.sent[index].set()
    try:
        return await _stream(client, f"{base_url}{path}", body, headers, req, res, clock, order, index)
    finally:  # a failed or cancelled request must not hold the request tied after it
        if order is not None:
            order.heads[index].set()


async def _stream(
    client: httpx.AsyncClient, url: str, body: dict[str, Any], headers: dict[str, str], req: PlannedRequest,
    res: ClientResult, clock: Clock, order: SendOrder | None, index: int,
) -> ClientResult:
    """Send one request and time its stream into `res`."""
    per_choice: dict[int, int] = {}  # continuous usage counts each choice's own tokens (n > 1: one per child)
    try:
        async with client.stream("POST", url, json=body, headers=headers) as resp:
            res.head_ts = clock.now()
            if order is not None:
                order.heads[index].set()
            if resp.status_code != 200:
                res.status = f"http_{resp.status_code}"
                res.error = (await resp.aread())[:300].decode("utf-8", "replace")
                return res
            async for line in resp.aiter_lines():
                now = clock.now()
                chunk = parse_sse_line(line)
                if chunk is None:
                    continue
                if res.response_id is None and isinstance(chunk.get("id"), str):
                    res.response_id = chunk["id"]
                    # Completions: one engine request per prompt, "<response id>-<prompt index>";
                    # chat: the engine request id is the response id.
                    res.vllm_request_id = res.response_id if req.api == "chat" else f"{res.response_id}-0"
                usage = chunk.get("usage") or {}
                choices = chunk.get("choices") or []
                done = int(usage.get("completion_tokens") or 0)
                if choices and isinstance(choices[0], dict):  # a choice's chunk: usage is that choice's so far
                    per_choice[int(choices[0].get("index") or 0)] = done
                    done = sum(per_choice.values())
                new = done - res.output_tokens
                if new > 0:
                    if res.first_token_ts is None:
                        res.first_token_ts = now
                    res.token_ts.extend([now] * new)
                    res.output_tokens = done
                if usage.get("prompt_tokens"):
                    res.prompt_tokens = int(usage["prompt_tokens"])
        res.finish_ts = clock.now()
        res.status = "ok" if res.output_tokens == req.n * req.max_tokens else "short_output"
    except (httpx.HTTPError, ValueError) as e:
        res.status, res.error = "error", f"{type(e).__name__}: {e}"[:300]
    return res


async def run_plan(
    base_url: str, model: str, plan: list[PlannedRequest], start_ts: float, timeout_s: float,
    transport: httpx.AsyncBaseTransport | None = None,
) -> tuple[list[ClientResult], dict[str, Any]]:
    """Send the plan; returns per-request results and the client's own lateness summary (`transport`: tests)."""
    clock = Clock()
    stop = asyncio.Event()
    beats: list[tuple[float, float]] = []
    hb = asyncio.create_task(_heartbeat(stop, clock, beats))
    limits = httpx.Limits(max_connections=len(plan) + 4, max_keepalive_connections=len(plan) + 4)
    timeout = httpx.Timeout(timeout_s, connect=10.0)
    async with httpx.AsyncClient(limits=limits, timeout=timeout, trust_env=False, transport=transport) as client:
        # Warm up before the first intended send: the first request pays lazy imports and pool set-up.
        with contextlib.suppress(httpx.HTTPError):
            await client.get(f"{base_url}/health")
        slots = send_slots(plan)
        order = SendOrder.for_plan(len(plan))
        tasks = [
            asyncio.create_task(_one(client, base_url, model, r, start_ts, clock, slot, order, i,
                                     None if slot.after is None else plan[slot.after].spec_id))
            for i, (r, slot) in enumerate(zip(plan, slots, strict=True))
        ]
        done, pending = await asyncio.wait(tasks, timeout=max(1.0, start_ts + timeout_s - clock.now()))
        for t in pending:
            t.cancel()
        results = []
        for t, r, slot in zip(tasks, plan, slots, strict=True):
            if t in done and not t.cancelled() and t.exception() is None:
                results.append(t.result())
            else:
                results.append(
                    ClientResult(r.request_id, r.spec_id, r.klass, r.is_whale, None, start_ts + slot.offset_s,
                                 status="timeout", max_tokens=r.max_tokens)
                )
    stop.set()
    await hb
    lags = [lag for r, s in zip(results, slots, strict=True)
            if (lag := own_send_lag(r, results[s.after] if s.head and s.after is not None else None)) is not None]
    # Only lateness while requests are in flight bends a measurement; start-up hiccups do not.
    first = min((start_ts + s.offset_s for s in slots), default=start_ts) - 0.05
    lateness = sorted(late for t, late in beats if t >= first)
    summary: dict[str, Any] = {
        "send_lag_max_s": max(lags, default=0.0),
        "heartbeat_interval_s": HEARTBEAT_S,
        "heartbeat_samples": len(lateness),
        "heartbeat_lateness_max_s": lateness[-1] if lateness else 0.0,
        "heartbeat_lateness_p99_s": lateness[int(0.99 * (len(lateness) - 1))] if lateness else 0.0,
        "heartbeat_top_s": [round(x, 4) for x in lateness[-5:]],
        "heartbeat_top_at_s": [round(t - start_ts, 3) for t, late in sorted(beats, key=lambda b: b[1])[-5:]],
        "scheduling_priority": os.getpriority(os.PRIO_PROCESS, 0),
        "scheduling_policy": "SCHED_RR" if os.sched_getscheduler(0) == os.SCHED_RR else "SCHED_OTHER",
        "cpus": sorted(os.sched_getaffinity(0)),
        **tie_summary(results, slots),
    }
    summary["lateness_s"] = max(summary["send_lag_max_s"], summary["heartbeat_lateness_max_s"])
    return results, summary


def _ready_ts(res: ClientResult, pred: ClientResult | None) -> float:
    """When a request could go: its intended time, or its tied predecessor's response head if that came later and
    released it (not the cap, not the predecessor's failure)."""
    if pred is None or pred.head_ts is None or res.actual_send_ts is None or res.actual_send_ts < pred.head_ts:
        return res.intended_send_ts
    return max(res.intended_send_ts, pred.head_ts)


def own_send_lag(res: ClientResult, pred: ClientResult | None) -> float | None:
    """The client's own send lag: from when the request could go. A tie's wait for its predecessor's head is vLLM's
    API server's time (a request sent at once would have queued there as long), so it is not the client's lateness;
    `tie_wait_max_s` reports it. A wait that hit the cap counts in full."""
    return None if res.actual_send_ts is None else res.actual_send_ts - _ready_ts(res, pred)


def tie_summary(results: Sequence[ClientResult], slots: Sequence[SendSlot]) -> dict[str, Any]:
    """How many sends were tied (and waited for a head), how long they waited, and whether each went after the request
    before it (and after its head where it waited for it)."""
    tied = [(res, results[s.after], s.head) for res, s in zip(results, slots, strict=True) if s.after is not None]
    kept = all(
        r.actual_send_ts is not None and p.send_seq is not None and r.send_seq is not None and r.send_seq > p.send_seq
        and (not head or (p.head_ts is not None and r.actual_send_ts >= p.head_ts))
        for r, p, head in tied
    )
    wait = max((_ready_ts(r, p) - r.intended_send_ts for r, p, head in tied if head), default=0.0)
    return {"tie_gap_s": TIE_GAP_S, "tied_sends": len(tied), "tie_head_waits": sum(h for _, _, h in tied),
            "tie_order_kept": kept, "tie_wait_max_s": wait}


def _raise_priority() -> None:
    """Real-time round-robin (lowest RT priority) when permitted, else nice -10, else the default.

    vLLM's engine core waits for its worker by spinning on `sched_yield()` for up to a second after each
    result; on a preempt-none kernel with EEVDF that spin was measured to keep even a nice -15 process off its
    core for a whole whale prefill (0.4-1.1 s), faking seconds of TTFT. A real-time client preempts it at once,
    and it sleeps on I/O almost all the time, so it takes little from vLLM (the kernel also caps RT time)."""
    try:
        os.sched_setscheduler(0, os.SCHED_RR, os.sched_param(1))
        return
    except (PermissionError, OSError, AttributeError):
        pass
    try:
        os.setpriority(os.PRIO_PROCESS, 0, -10)
    except (PermissionError, OSError):
        pass


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    if len(args) != 2:
        print("usage: python -m attrib_agent.lab.client PLAN.json OUT.json", file=sys.stderr)
        return 2
    _raise_priority()
    spec = json.loads(open(args[0]).read())
    if spec.get("cpus"):  # the cores vLLM's engine leaves free: on its core the client stalls for whole prefills
        os.sched_setaffinity(0, spec["cpus"])
    plan = [PlannedRequest(**r) for r in spec["requests"]]
    gc.collect()
    gc.disable()  # a collector pause would read as server latency; a run allocates little
    results, summary = asyncio.run(
        run_plan(spec["base_url"], spec["model"], plan, spec["start_ts"], spec["timeout_s"])
    )
    with open(args[1], "w") as f:
        json.dump({"results": [asdict(r) for r in results], "summary": summary}, f)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
