"""vLLM's default prefix cache on a real recording: `vllm bench serve` with 3 shared prefixes of 1,792 tokens
(91 % of prompt tokens were cache hits), replayed through the pipeline."""

from __future__ import annotations

import statistics
from functools import cache
from pathlib import Path

from attrib_agent.events import Event
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline import EngineTimeline
from attrib_agent.timeline.ledger import residual_stats

RECORDING = Path(__file__).parents[2] / "fixtures" / "recordings" / "bench-prefix"


@cache
def events() -> tuple[Event, ...]:
    return tuple(ReplaySource(RECORDING).events())


def test_cached_prompt_tokens_are_inferred_and_the_steps_explained() -> None:
    tl = EngineTimeline()
    tl.feed_all(events())
    hits = [tl.cached_tokens(lc.request_id) for lc in tl.lifecycles()]
    prompts = [lc.prompt_tokens or 0 for lc in tl.lifecycles()]
    assert sum(hits) >= 0.8 * sum(prompts)  # vLLM's counters: 101,888 of 111,382 prompt tokens hit
    assert all(h % 128 == 0 and h < p for h, p in zip(hits, prompts, strict=True))  # whole blocks, last recomputed
    q = tl.membership_quality()
    assert q.exact_share >= 0.98, q


def test_the_ledger_counts_shared_prefix_blocks_once() -> None:
    tl = EngineTimeline()
    tl.feed_all(events())
    usable = (tl.pool()[1] or 0) - 1
    stats = residual_stats(tl.ledger.reconciliations())
    print(f"\n|residual| at {stats.n} samples: median {stats.median_abs:.2f}, p95 {stats.p95_abs:.2f}, "
          f"max {stats.max_abs:.2f} blocks of {usable}")
    assert stats.n >= 10
    assert stats.median_abs <= 0.05 * usable and stats.p95_abs <= 0.05 * usable


def test_every_finished_request_gets_a_result_of_usable_quality() -> None:
    p = AttributionPipeline()
    results = {r.request_id: r for r in (*p.feed_all(list(events())), *p.settle())}
    finished = {lc.request_id for lc in p.lifecycles() if lc.complete}
    assert finished and finished <= set(results)
    median = statistics.median(r.quality for r in results.values())
    print(f"\nquality median {median:.3f} over {len(results)} results")
    assert median >= 0.7
