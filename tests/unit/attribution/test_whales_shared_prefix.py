"""The whale rule on shared-prefix traffic (issue 11, item 4): the first request of a prefix group computes the
prefix its peers then read from the cache, yet holds and adds no more than they do, so it is no whale; a request
a few times longer than the shorts' prompts, whose tokens nobody reads, is one."""

from __future__ import annotations

from functools import cache
from pathlib import Path

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.whales import KvUse, footprints, whales
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"
POOL = 95 * 128  # bench-prefix's KV pool in tokens


def group(name: str, n: int, prefix: int = 1_792, suffix: int = 64, out: int = 32) -> list[KvUse]:
    """A prefix group in arrival order: the leader computes the prefix, its peers hit it."""
    return [KvUse(f"{name}{i}", prefix + suffix, out, prefix if i else 0) for i in range(n)]


def test_prefix_group_leaders_are_not_whales() -> None:
    a, b, c = group("a", 20), group("b", 20), group("c", 20)
    uses = [*a[:2], *b[:2], *c[:2], *a[2:], *b[2:], *c[2:]]  # interleaved, as Poisson arrivals have them
    weights = footprints(uses)
    assert {weights[u.request_id] for u in uses} == {64 + 32}  # leaders weigh what their peers do
    assert whales(weights, 8.0, POOL) == []
    # Without the later hits counted, each leader is 20x the median and holds more than an eighth of the pool.
    assert set(whales({u.request_id: u.prompt_tokens - u.cached_tokens + 32 for u in uses}, 8.0, POOL)) == {
        "a0", "b0", "c0"}


def test_a_real_whale_among_shorts_with_long_cached_prefixes_is_a_whale() -> None:
    a = group("a", 30)
    for whale in (KvUse("w", 3 * 1_856, 32), KvUse("w", 3 * 1_856, 32, cached_tokens=1_792)):
        for at in (0, 1, 15, 30):  # before the leader, right after it, mid-stream, last
            uses = [*a[:at], whale, *a[at:]]
            assert whales(footprints(uses), 8.0) == ["w"], (whale, at)
            assert whales(footprints(uses), 8.0, POOL) == ["w"], (whale, at)


def test_without_shared_prefixes_the_footprint_is_the_whole_request() -> None:
    uses = [KvUse(f"s{i}", 200 + i, 50) for i in range(9)] + [KvUse("w", 6_000, 16)]
    assert footprints(uses) == {u.request_id: u.prompt_tokens + u.output_tokens for u in uses}


@cache
def replayed(name: str) -> tuple[AttributionPipeline, dict[str, AttributionResult]]:
    p = AttributionPipeline()
    events = list(ReplaySource(RECORDINGS / name).events())
    results = {r.request_id: r for r in (*p.feed_all(events), *p.settle())}
    return p, results


def test_bench_prefix_no_leader_is_a_whale() -> None:
    """`vllm bench serve --dataset-name prefix_repetition`: 3 prefixes of 1,792 tokens, 60 prompts; each prefix's
    first request computed it (no cache hit). Before: the three leaders were whales (each 1,888 uncached tokens,
    20x the median and more than an eighth of the 12,160-token pool)."""
    p, results = replayed("bench-prefix")
    tl = p.timeline
    leaders = {lc.request_id for lc in tl.lifecycles() if tl.cached_tokens(lc.request_id) == 0}
    assert len(leaders) == 3, leaders
    assert not [r.request_id for r in results.values() if r.is_whale]
    assert not {c.request_id for r in results.values() for c in r.culprits if c.is_whale}
    assert not whales(footprints(p._kv_uses()), 8.0, POOL)


def test_bench_mixed_keeps_its_whales() -> None:
    """Random prompts share little: the long prompts (2,500-4,427 tokens, sent mid-stream; median request 288)
    stay whales."""
    _, results = replayed("bench-mixed")
    named = {r.request_id for r in results.values() if r.is_whale}
    longs = {r.request_id for r in results.values() if (r.prompt_tokens or 0) >= 2_000}
    assert len(longs) >= 3 and longs <= named, (longs, named)
