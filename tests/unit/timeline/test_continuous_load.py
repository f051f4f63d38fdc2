"""Continuous load (never idle, so no busy period ever closes) beside calls that never enter the engine.

What `vllm bench serve` does to a server: one `POST /tokenize` first (vLLM logs `Received request
tokenize-<hex>: params: None, lora_request: None.` and nothing else for it), then Poisson traffic for minutes.
The engine is the test suite's vLLM-rules fake (tests/unit/timeline/fake_engine.py), whose events have the
shapes of tests/golden/logs (`Received` with vLLM's millisecond stamp and max_tokens, `Added` with the internal
`<id>-<8 hex>` id, `Iteration` steps, `llm_request` spans landing `span_delay_s` after the finish, scrapes).
They go through the pipeline's real interface, `feed`, one at a time in receipt order, as live.
"""

from __future__ import annotations

import json
import random
from functools import cache

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.events import Event, RequestAborted, RequestReceived, RequestSpan
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.api.timeline import timeline_json

from .fake_engine import T0, FakeConfig, FakeRequest, FakeRun, run

TOKENIZE = "tokenize-8d3f0c2a9b1e4f6c8d7a6b5c4d3e2f10"
DURATION_S = 120.0
SPAN_DELAY_S = 0.5  # OTEL_BSP_SCHEDULE_DELAY=500 in the by-hand recipe
FRESH_S = 2.0  # a final result within this much event time of its span's arrival


@cache
def continuous() -> FakeRun:
    """Random arrivals (0.2-1.1 s apart, 1.5/s) of short requests with a longer one (4-6 s of decode) every
    third, for two minutes, on steps of 25 ms (vLLM on a CPU): a long one is always in flight, never idle."""
    rng = random.Random(11)
    reqs, t, i = [], 0.5, 0
    while t < DURATION_S:
        long = i % 3 == 1
        reqs.append(FakeRequest(f"cmpl-bench-{i}-0", t, rng.randint(600, 900) if long else rng.randint(20, 200),
                                rng.randint(160, 240) if long else rng.randint(20, 60)))
        t += rng.uniform(0.2, 1.1)
        i += 1
    return run(FakeConfig(budget=512, block_size=16, num_blocks=400, span_delay_s=SPAN_DELAY_S,
                         step_s=0.025), reqs)


def with_tokenize(events: list[Event]) -> list[Event]:
    """The client's one /tokenize call, at the start: its `Received` line and nothing else, ever."""
    first = RequestReceived(T0 + 0.2004, T0 + 0.2, TOKENIZE, None)
    return sorted([*events, first], key=lambda e: e.ts)


@cache
def fed(tokenize: bool) -> tuple[AttributionPipeline, list[tuple[float, AttributionResult]]]:
    """The stream fed once per module (the pipeline is deterministic: a second feed gives the same)."""
    events = continuous().events
    return feed(with_tokenize(events) if tokenize else events)


def feed(events: list[Event]) -> tuple[AttributionPipeline, list[tuple[float, AttributionResult]]]:
    p = AttributionPipeline()
    out: list[tuple[float, AttributionResult]] = []
    for ev in events:
        for r in p.feed(ev):
            assert p.last_event_ts is not None
            out.append((p.last_event_ts, r))
    return p, out


def test_the_fake_traffic_never_lets_the_engine_idle() -> None:
    steps = [e for e in continuous().events if type(e).__name__ == "EngineStep"]
    gaps = [b.ts - a.ts for a, b in zip(steps, steps[1:], strict=False)]
    assert steps[-1].ts - steps[0].ts > DURATION_S - 5 and max(gaps) < 0.2  # one busy period, three minutes long


def test_every_request_is_final_within_seconds_of_its_span_and_the_tokenize_call_is_nowhere() -> None:
    events = with_tokenize(continuous().events)
    p, out = fed(True)
    landed = {e.request_id: e.ts for e in events if isinstance(e, RequestSpan)}
    final_at = {r.request_id: at for at, r in out if r.final}
    assert len(landed) > 150 and set(final_at) <= set(landed)
    settled = [rid for rid, ts in landed.items() if ts < events[-1].ts - FRESH_S]
    late = {rid: (final_at[rid] - landed[rid]) if rid in final_at else None for rid in settled
            if rid not in final_at or final_at[rid] - landed[rid] > FRESH_S}
    assert not late, f"{len(late)} of {len(settled)} not final {FRESH_S} s after their span: {list(late.items())[:5]}"
    lags = sorted(final_at[rid] - landed[rid] for rid in settled)
    assert lags[len(lags) // 2] <= 0.5  # most need no wait at all beyond the next settle pass
    # the tokenize call: not a request anywhere
    assert p.status(TOKENIZE) == "unknown" and p.timeline.lifecycle(TOKENIZE) is None
    assert all(r.request_id != TOKENIZE and all(c.request_id != TOKENIZE for c in r.culprits) for _, r in out)
    assert TOKENIZE not in json.dumps(timeline_json(p, None, None))
    assert p.timeline.never_admitted()[0] == 1 and p.timeline.sizes()["unadmitted"] == 0


def same_finals(a: list[AttributionResult], b: list[AttributionResult], settled: set[str] | None = None) -> None:
    """The same requests final with the same answers. (Not bit for bit: extra events move the settle passes,
    and with them when the online cost model and frontend offsets learn; that moves baselines by microseconds.)"""
    fa = {r.request_id: r for r in a if r.final and (settled is None or r.request_id in settled)}
    fb = {r.request_id: r for r in b if r.final and (settled is None or r.request_id in settled)}
    assert set(fa) == set(fb)
    for rid, x in fa.items():
        y = fb[rid]
        assert abs(x.ttft_slowdown_s - y.ttft_slowdown_s) < 0.005 and abs(x.itl_slowdown_s - y.itl_slowdown_s) < 0.002
        named = [{c.request_id for c in r.culprits if c.share > 0.1} for r in (x, y)]
        assert named[0] == named[1]


def test_the_tokenize_call_changes_no_result() -> None:
    same_finals([r for _, r in fed(False)[1]], [r for _, r in fed(True)[1]])


def test_received_ids_never_added_are_bounded_and_change_nothing() -> None:
    """A flood of ids vLLM logs `Received` for but never adds (rejected, or other non-generation calls): held
    at most MAX_UNADMITTED at a time and for ADMIT_WINDOW_S of event time, and no result moves."""
    base = [e for e in continuous().events if e.ts < T0 + 40.0]
    flood: list[Event] = [RequestReceived(T0 + k * 0.01 + 0.0004, T0 + k * 0.01, f"cmpl-rejected-{k}-0", 16)
                          for k in range(4000)]  # 100 a second for 40 s
    flood += [RequestAborted(T0 + 5.0, T0 + 5.0, "cmpl-rejected-3-0")]  # aborted before it was added
    p = AttributionPipeline()
    results_plain = [r for ev in base for r in p.feed(ev)]
    q = AttributionPipeline()
    held = 0
    results_flooded: list[AttributionResult] = []
    for ev in sorted([*base, *flood], key=lambda e: e.ts):
        results_flooded += q.feed(ev)
        held = max(held, q.timeline.sizes()["unadmitted"])
    settled = {e.request_id for e in base if isinstance(e, RequestSpan) and e.ts < base[-1].ts - FRESH_S}
    same_finals(results_flooded, results_plain, settled)
    assert held == 1024  # the count bound (30 s at 100/s would be 3,000)
    assert not any("rejected" in lc.request_id for lc in q.timeline.lifecycles())
    assert q.timeline.never_admitted()[1] >= 4000 - 1024


def test_received_ids_leave_after_the_window_of_event_time() -> None:
    p = AttributionPipeline()
    p.feed(RequestReceived(T0 + 0.0004, T0, "cmpl-rejected-0", 16))
    assert p.timeline.sizes()["unadmitted"] == 1 and p.status("cmpl-rejected-0") == "unknown"
    for ev in continuous().events:
        if ev.ts > T0 + 40.0:
            break
        p.feed(ev)
    assert p.timeline.sizes()["unadmitted"] == 0 and p.timeline.never_admitted() == (0, 1)
