"""A result is final as soon as what it reads has been seen, not a fixed margin later; and, while the agent sheds,
a chosen victim's pass is not held for passes that had nothing to attribute.

Never-idle traffic from the suite's vLLM-rules fake (tests/unit/timeline/fake_engine.py: millisecond log stamps,
`Iteration` lines logged as vLLM logs them, after the spans of the requests the step finished), with spans landing
soon after the finish (a GPU server's exports), fed one event at a time through `feed`, as live.
"""

from __future__ import annotations

import math
import random
import statistics
import zlib
from collections.abc import Iterable
from dataclasses import replace
from functools import cache

from attrib_agent.events import EngineStep, Event, RequestAdded, RequestReceived, RequestSpan
from attrib_agent.pipeline import MAX_PASS_WAIT_S, AttributionPipeline, PipelineConfig, chosen

from .fake_engine import FakeConfig, FakeRequest, run

SPAN_DELAY_S = 0.05


@cache
def traffic() -> tuple[Event, ...]:
    """30 s never idle: shorts 0.2-0.6 s apart and a longer request every third."""
    rng = random.Random(5)
    reqs, t, i = [], 0.5, 0
    while t < 30.0:
        long = i % 3 == 1
        reqs.append(FakeRequest(f"cmpl-fresh-{i}-0", t, rng.randint(300, 600) if long else rng.randint(20, 200),
                                rng.randint(80, 160) if long else rng.randint(10, 40)))
        t += rng.uniform(0.2, 0.6)
        i += 1
    return tuple(run(FakeConfig(budget=512, block_size=16, num_blocks=400, span_delay_s=SPAN_DELAY_S,
                                step_s=0.025), reqs).events)


def whole_second_stamps(events: Iterable[Event]) -> list[Event]:
    """vLLM's default log format: 1 s stamps, so the timeline times lines by receipt and cannot order them with
    span ends."""
    return [replace(e, log_ts=math.floor(e.log_ts)) if isinstance(e, EngineStep | RequestReceived | RequestAdded)
            and e.log_ts is not None else e for e in events]


def lags(events: list[Event] | tuple[Event, ...]) -> tuple[list[float], int]:
    """Event time from each span's landing to its final result, and how many results went out partial first."""
    p = AttributionPipeline()
    landed = {e.request_id: e.ts for e in events if isinstance(e, RequestSpan)}
    final_at: dict[str, float] = {}
    partial_first = 0
    for ev in events:
        for r in p.feed(ev):
            assert p.last_event_ts is not None
            if r.final:
                final_at.setdefault(r.request_id, p.last_event_ts)
            elif r.request_id not in final_at:
                partial_first += 1
    settled = [rid for rid, ts in landed.items() if ts < events[-1].ts - 2.0]
    assert len(settled) > 50 and all(rid in final_at for rid in settled)
    return sorted(final_at[rid] - landed[rid] for rid in settled), partial_first


def test_a_result_is_final_once_the_log_has_been_read_past_its_finish() -> None:
    """With vLLM's millisecond stamps, a step line stamped past the victim's finish says every line logged before
    it has been read: no partial result waits out `settle_margin_s` (0.5 s) for its own lines. Where stamps are
    whole seconds the margin still holds (the log's order against the span cannot be told)."""
    margin = PipelineConfig().settle_margin_s
    interval = PipelineConfig().settle_interval_s
    fine, fine_partial = lags(traffic())
    coarse, coarse_partial = lags(whole_second_stamps(traffic()))
    assert statistics.median(fine) <= interval  # the next settle pass
    assert statistics.median(coarse) >= margin - SPAN_DELAY_S - interval  # was the case for all before
    assert fine_partial < coarse_partial / 4


def test_while_shedding_a_chosen_victims_pass_is_not_held_by_passes_with_nothing_to_attribute() -> None:
    """At a low share, most settle ticks have no chosen victim: they run no pass, the shed requests are told
    `skipped` at once, and a chosen victim's pass runs at the next tick unless one ran within MAX_PASS_WAIT_S."""
    share = 0.2
    p = AttributionPipeline()
    p.pass_gap_s, p.attribute_share = 10.0, share  # as the agent sheds
    passes: list[float] = []
    real = p.attributor.attribute

    def attribute(timeline: object, ids: object) -> object:
        passes.append(p.last_event_ts or 0.0)
        return real(timeline, ids)  # type: ignore[arg-type]

    p.attributor.attribute = attribute  # type: ignore[method-assign,assignment]
    landed: dict[str, float] = {}
    told: dict[str, float] = {}
    final_at: dict[str, float] = {}
    slowed: set[str] = set()  # attributed outside the share as visibly slowed (pipeline.visible_slowdown)
    for ev in traffic():
        if isinstance(ev, RequestSpan):
            landed[ev.request_id] = ev.ts
        for r in p.feed(ev):
            if r.final:
                final_at.setdefault(r.request_id, ev.ts)
                if r.chosen_by == "slowed":
                    slowed.add(r.request_id)
        for rid in landed.keys() - told.keys():
            if p.status(rid) in ("skipped", "final", "partial"):
                told[rid] = ev.ts
    interval = p.config.settle_interval_s
    mine = {rid for rid in landed if chosen(rid, share)}
    assert mine and mine == {rid for rid in landed if zlib.crc32(rid.encode()) < share * 2**32}
    assert final_at.keys() - slowed <= mine and not slowed & mine
    assert len(final_at.keys() & mine) >= len(mine) - 3  # the last ones may still wait
    assert len(passes) <= len(final_at) + 3  # no pass without a victim (a partial's recheck aside)
    gaps = [b - a for a, b in zip(passes, passes[1:], strict=False)]
    assert min(gaps) >= MAX_PASS_WAIT_S
    # a victim landing a pass-wait after the last pass is attributed at the next tick (it was: the next second)
    lone = [final_at[rid] - landed[rid] for rid in final_at
            if all(not (landed[rid] - MAX_PASS_WAIT_S <= t < landed[rid]) for t in passes)]
    assert lone and max(lone) <= 1.4 * interval  # the tick, and the events it waits for (steps 25 ms apart)
    shed = [told[rid] - landed[rid] for rid in landed.keys() - mine if rid in told]
    assert len(shed) > 20 and max(shed) <= 1.4 * interval  # told `skipped` at the next tick, not the next pass
