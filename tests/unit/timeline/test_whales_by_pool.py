"""Whales by what they hold, blame that reaches the KV holders, and a shortfall that skips a decoy: synthetic
busy periods of the vLLM-rules engine (fake_engine.py) through the attributor's real interface."""

from __future__ import annotations

import dataclasses

import pytest

from attrib_agent.attribution.attributor import Attributor
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.shapley import even_split, largest_effects, with_shortfall
from attrib_agent.attribution.whales import kv_footprint, whales
from attrib_agent.events import Event, RequestSpan
from attrib_agent.timeline.engine_timeline import EngineTimeline

from .fake_engine import FakeConfig, FakeRequest, run


def attribute(events: list[Event]) -> dict[str, AttributionResult]:
    tl = EngineTimeline()
    tl.feed_all(events)
    return {r.request_id: r for r in Attributor().attribute(tl)}


def test_whale_rule_counts_uncached_tokens_and_the_pool() -> None:
    # Every short carries a 2,000-token cached prefix; the real whale (6,000 uncached) is 3x their prompts.
    shorts = {f"s{i}": kv_footprint(2_200, 100, cached_tokens=2_000) for i in range(20)}
    assert whales({**shorts, "w": kv_footprint(6_000, 100)}, 8.0) == ["w"]
    # Nominal lengths would call every request alike (2,300 vs 6,100: under 8x the median).
    assert whales({**{s: 2_300 for s in shorts}, "w": 6_100}, 8.0) == []
    # Continuous mixed traffic whose median is high: a request holding half the pool is a whale anyway.
    mixed = {f"m{i}": 1_100 for i in range(30)}
    assert whales({**mixed, "big": 5_900}, 8.0) == []
    assert whales({**mixed, "big": 5_900}, 8.0, pool_tokens=12_288) == ["big"]
    assert whales(mixed, 8.0, pool_tokens=12_288) == []  # an eighth of the pool is 1,536 tokens


def test_a_short_behind_an_unadmittable_prompt_blames_the_kv_holders_too() -> None:
    """Two longs hold 90 % of the pool (45 of 100 blocks each); a long prompt arrives and cannot be admitted until
    one finishes; the shorts after it wait at the head-of-line. Remove either holder and the long prompt fits; remove
    the long prompt and the shorts fit: all three are needed, so the counterfactuals share the wait among them.
    The shorts are mid-sized (140 tokens), so no request is 8x the period's median: only the pool rule finds the
    holders."""
    cfg = FakeConfig(budget=512, block_size=16, num_blocks=100, span_delay_s=0.5, step_s=0.005)
    reqs = [FakeRequest("h1", 0.0, 640, 80), FakeRequest("h2", 0.01, 640, 80), FakeRequest("long", 0.1, 600, 8),
            *(FakeRequest(f"a{i}", 0.02 + 0.01 * i, 120, 4) for i in range(3)),
            *(FakeRequest(f"s{i}", 0.12 + 0.02 * i, 120, 4) for i in range(4))]
    results = attribute(run(cfg, reqs).events)
    waited = [results[f"s{i}"] for i in range(4)]
    assert all(r.ttft_slowdown_s > 0.1 for r in waited)  # they queued for the holders' decode (~0.4 s)
    for r in waited:
        blame = {c.request_id: c for c in r.culprits}
        assert {"h1", "h2", "long"} <= set(blame), r
        assert all(blame[w].is_whale for w in ("h1", "h2", "long"))
        total = sum(c.ttft_s for c in r.culprits)
        for holder in ("h1", "h2"):
            assert blame[holder].ttft_s >= 0.2 * total, (holder, r)
        assert blame["long"].ttft_s <= 0.6 * total  # the head of the queue is not the whole story


def test_a_shortfall_goes_to_the_whale_not_to_the_decoy() -> None:
    """A 3,000-token whale prefills while a decoy (20 prompt tokens, 600 outputs) decodes beside everyone: the
    re-simulation sees the whale slow the shorts and the decoy add ~nothing. The observed TTFTs of the shorts that
    arrived during the whale's prefill are then longer than any simulation (100 ms more, as when the API server
    is starved): that shortfall belongs to the whale the counterfactuals point at, not half to the decoy."""
    cfg = FakeConfig(budget=512, block_size=16, num_blocks=2_000, span_delay_s=0.5, step_s=0.005)
    reqs = [FakeRequest("decoy", 0.0, 20, 600), FakeRequest("w", 0.1, 3_000, 4),
            *(FakeRequest(f"s{i}", 0.02 + 0.02 * i, 20, 8) for i in range(12))]
    fr = run(cfg, reqs)
    prefill = (0.1, 0.1 + 0.2)
    late = {f"s{i}" for i, r in enumerate(reqs[2:]) if prefill[0] <= r.arrival <= prefill[1]}
    assert len(late) >= 4
    events = [_later(e, 0.1) if isinstance(e, RequestSpan) and e.request_id in late else e for e in fr.events]
    results = attribute(events)
    whale_total = decoy_total = 0.0
    for rid in late:
        blame = {c.request_id: c.ttft_s for c in results[rid].culprits}
        assert blame.get("w", 0.0) > 0.5 * results[rid].ttft_slowdown_s, results[rid]
        whale_total += blame.get("w", 0.0)
        decoy_total += blame.get("decoy", 0.0)
    assert decoy_total < 0.1 * whale_total, (decoy_total, whale_total)


def _later(span: RequestSpan, extra_s: float) -> RequestSpan:
    assert span.ttft_s is not None and span.queue_s is not None
    return dataclasses.replace(span, ttft_s=span.ttft_s + extra_s, queue_s=span.queue_s + extra_s)


def test_shortfall_is_a_unanimity_game_of_the_relevant_players() -> None:
    worlds = {frozenset(): 0.0, frozenset({"w"}): 0.3, frozenset({"d"}): 0.0, frozenset({"w", "d"}): 0.302}
    effects = largest_effects(["w", "d"], worlds.__getitem__)
    assert effects == pytest.approx({"w": 0.302, "d": 0.002})
    relevant = [p for p, e in effects.items() if e >= 0.03]
    phi = with_shortfall({"w": 0.301, "d": 0.001}, even_split(0.5, relevant))
    assert phi == pytest.approx({"w": 0.801, "d": 0.001})  # efficiency kept: sum = simulated effect + shortfall
    # nobody relevant: unexplained
    assert with_shortfall({"w": 0.3, "d": 0.0}, even_split(0.5, [])) == {"w": 0.3, "d": 0.0}
