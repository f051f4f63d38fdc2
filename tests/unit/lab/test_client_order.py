"""The lab client sends requests planned for the same instant in the plan's order, each after the one before it
got its response head: a counterfactual truth's conditions must differ only in the whales present, not in which of
two tied requests reaches vLLM first (score12: whale2's s002 and w2 swapped with the condition)."""

from __future__ import annotations

import asyncio
import itertools
import json
from typing import Any

import httpx

from attrib_agent.lab.client import (
    TIE_GAP_S,
    ClientResult,
    Clock,
    PlannedRequest,
    own_send_lag,
    run_plan,
    send_slots,
)
from attrib_agent.lab.record import make_plan
from attrib_agent.lab.workload import SCENARIOS, get_scenario


def _req(spec_id: str, offset_s: float, tokens: int = 4) -> PlannedRequest:
    return PlannedRequest(spec_id, "siso", spec_id.startswith("w"), f"run-{spec_id}", offset_s, [1] * tokens, 2)


def test_a_tie_is_spaced_in_the_plans_order_and_others_are_untouched() -> None:
    plan = [_req("s001", 1.5), _req("s002", 2.0), _req("w2", 2.0, 5000), _req("x", 2.0), _req("s003", 2.5)]
    slots = send_slots(plan)
    assert [s.offset_s for s in slots] == [1.5, 2.0, 2.0 + TIE_GAP_S, 2.0 + 2 * TIE_GAP_S, 2.5]
    assert [s.after for s in slots] == [None, None, 1, 2, None]
    assert [s.head for s in slots] == [False, False, True, True, False]  # x follows a whale: it waits for its head


def test_a_near_tie_is_a_tie_and_an_unsorted_plan_is_ordered_by_offset() -> None:
    slots = send_slots([_req("w1", 1.0004), _req("a", 1.0), _req("c", 1.5)])
    assert slots[1].after is None and slots[0].after == 1 and slots[0].offset_s == round(1.0 + TIE_GAP_S, 9)
    assert slots[0].head and slots[2].after is None and slots[2].offset_s == 1.5


def test_a_tie_of_shorts_is_chained_but_not_spaced() -> None:
    """`marginal`'s bursts of k decoders must reach vLLM together (spaced by heads they spread over 20-256 ms)."""
    slots = send_slots([_req("k8d0", 3.8), _req("k8d1", 3.8), _req("k8d2", 3.8), _req("k8d3", 3.8004)])
    assert [s.offset_s for s in slots] == [3.8, 3.8, 3.8, 3.8004]
    assert [s.after for s in slots] == [None, 0, 1, 2] and not any(s.head for s in slots)


def _order(name: str, keep: tuple[str, ...]) -> list[str]:
    plan = make_plan(get_scenario(name).with_whales(keep), "t", "c")
    return [r.spec_id for r, _ in sorted(zip(plan, send_slots(plan), strict=True), key=lambda x: x[1].offset_s)]


def test_every_condition_sends_in_the_full_runs_order() -> None:
    """Any two requests go in the same order whichever whales the condition keeps (whale2: s002 before w2)."""
    for name, sc in SCENARIOS.items():
        whales = [w.spec_id for w in sc.whales]
        full = _order(name, tuple(whales))
        assert len(set(full)) == len(full)
        for k in range(len(whales)):
            for keep in itertools.combinations(whales, k):
                got = _order(name, keep)
                assert got == [s for s in full if s in got], (name, keep)
    assert _order("whale2", ("w2",)).index("s002") < _order("whale2", ("w2",)).index("w2")


def _serve(head_delay_s: dict[str, float], arrivals: list[tuple[str, float]], clock: Clock,
           fail: frozenset[str] = frozenset()) -> httpx.MockTransport:
    async def handler(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/health":
            return httpx.Response(200)
        rid = request.headers["X-Request-Id"].removeprefix("run-")
        arrivals.append((rid, clock.now()))
        if rid in fail:
            raise httpx.ConnectError("refused", request=request)
        await asyncio.sleep(head_delay_s.get(rid, 0.0))  # the server parses and hands it to its engine
        n = json.loads(request.content)["max_tokens"]
        body = "".join(f'data: {{"id": "cmpl-{rid}", "choices": [{{"index": 0, "text": "t"}}], "usage": '
                       f'{{"prompt_tokens": 4, "completion_tokens": {k}}}}}\n\n' for k in range(1, n + 1))
        return httpx.Response(200, content=body.encode() + b"data: [DONE]\n\n")

    return httpx.MockTransport(handler)


def test_a_tied_request_waits_for_the_earlier_ones_response_head() -> None:
    """s002's head comes 60 ms after it is sent: a gap alone would send w2 first into the server; the client waits."""
    clock = Clock()
    arrivals: list[tuple[str, float]] = []
    plan = [_req("s002", 0.0), _req("w2", 0.0, 5000), _req("s003", 0.02)]

    async def go() -> tuple[list[ClientResult], dict[str, Any]]:
        start = clock.now() + 0.05
        return await run_plan("http://vllm", "tiny", plan, start, 5.0,
                              transport=_serve({"s002": 0.06}, arrivals, clock))

    results, summary = asyncio.run(go())
    by = {r.spec_id: r for r in results}
    assert [a for a, _ in arrivals] == ["s002", "s003", "w2"]  # s003 is not tied: it does not wait
    w2_sent, s002_sent, s002_head = by["w2"].actual_send_ts, by["s002"].actual_send_ts, by["s002"].head_ts
    assert w2_sent is not None and s002_sent is not None and s002_head is not None
    assert by["w2"].send_after == "s002" and w2_sent >= s002_head and w2_sent - s002_sent >= 0.05
    assert [by[s].send_seq for s in ("s002", "s003", "w2")] == [0, 1, 2]
    assert by["s003"].send_after is None and by["s002"].send_after is None
    assert by["w2"].intended_send_ts == by["s002"].intended_send_ts + TIE_GAP_S
    assert summary["tied_sends"] == 1 and summary["tie_order_kept"] is True and summary["tie_gap_s"] == TIE_GAP_S
    # The 60 ms wait is the server's, reported apart: the client's own send lag stays small.
    assert summary["tie_wait_max_s"] >= 0.05 and summary["send_lag_max_s"] < 0.03
    assert all(r.status == "ok" for r in results)


def test_a_wait_that_hit_the_cap_is_the_clients_lateness() -> None:
    pred = ClientResult("a", "s002", "siso", False, None, 10.0, actual_send_ts=10.0, head_ts=11.5)
    late = ClientResult("b", "w2", "whale", True, None, 10.001, actual_send_ts=11.001)  # sent at the 1 s cap
    waited = ClientResult("c", "w2", "whale", True, None, 10.001, actual_send_ts=11.502)
    assert own_send_lag(late, pred) == 11.001 - 10.001
    assert abs((own_send_lag(waited, pred) or 0.0) - 0.002) < 1e-9 and own_send_lag(waited, None) == 11.502 - 10.001


def test_tied_shorts_go_in_the_plans_order_without_waiting_for_heads() -> None:
    clock = Clock()
    arrivals: list[tuple[str, float]] = []
    plan = [_req(f"d{i}", 0.0) for i in range(4)]

    async def go() -> tuple[list[ClientResult], dict[str, Any]]:
        return await run_plan("http://vllm", "tiny", plan, clock.now() + 0.05, 5.0,
                              transport=_serve({"d0": 0.06}, arrivals, clock))

    results, summary = asyncio.run(go())
    assert [a for a, _ in arrivals] == ["d0", "d1", "d2", "d3"] and [r.send_seq for r in results] == [0, 1, 2, 3]
    d0_head, d3_sent = results[0].head_ts, results[3].actual_send_ts
    assert d0_head is not None and d3_sent is not None and d3_sent < d0_head  # nobody waited for d0's 60 ms head
    assert summary["tied_sends"] == 3 and summary["tie_head_waits"] == 0 and summary["tie_order_kept"] is True


def test_a_failed_request_does_not_hold_the_one_tied_after_it() -> None:
    clock = Clock()
    arrivals: list[tuple[str, float]] = []
    plan = [_req("s002", 0.0), _req("w2", 0.0)]

    async def go() -> list[ClientResult]:
        res, _ = await run_plan("http://vllm", "tiny", plan, clock.now() + 0.05, 5.0,
                                transport=_serve({}, arrivals, clock, fail=frozenset({"s002"})))
        return res

    s002, w2 = asyncio.run(go())
    assert s002.status == "error" and w2.status == "ok" and w2.send_after == "s002"
    assert w2.actual_send_ts is not None and s002.actual_send_ts is not None
    assert w2.actual_send_ts - s002.actual_send_ts < 0.5  # released at once, not after the 1 s cap
