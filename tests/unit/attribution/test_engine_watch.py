"""A saved fit's engine fingerprint reads the pool as the timeline resolved it: one rule (settings over
`vllm:cache_config_info`, both parts known), kept when a stepped clock replaces the timeline."""

from __future__ import annotations

from attrib_agent.events import MetricsSnapshot
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig


def scrape(ts: float, block_size: int | None, blocks: int | None, model: str = "m") -> MetricsSnapshot:
    return MetricsSnapshot(ts, "0", model, 1.0, 0.0, 0.1, 0.0, 0.0, 0.0, None, None, None, None, block_size, blocks)


def pools(p: AttributionPipeline) -> tuple[tuple[int | None, int | None], tuple[int | None, int | None]]:
    fp = p.engine_watch.fingerprint()
    assert fp is not None
    return (fp.block_size, fp.num_blocks), p.timeline.pool()


def test_the_fingerprint_reads_the_timelines_pool() -> None:
    p = AttributionPipeline()
    assert p.engine_watch.fingerprint() is None  # no scrape yet
    p.feed(scrape(100.0, 16, None))  # half known: the timeline waits for both parts, so does the fingerprint
    assert pools(p) == ((None, None), (None, None))
    p.feed(scrape(100.5, 16, 900))
    assert pools(p) == ((16, 900), (16, 900))
    p.feed(scrape(101.0, None, None))  # a scrape without cache_config_info keeps what was known
    assert pools(p) == ((16, 900), (16, 900))
    p.feed(scrape(10.0, None, None))  # the clock stepped back: a new timeline, which learns the pool again
    assert p.clock_steps_back == 1 and pools(p)[0] == (16, 900)


def test_settings_override_the_scraped_pool_in_both() -> None:
    p = AttributionPipeline(PipelineConfig(block_size=32))
    p.feed(scrape(100.0, 16, 900, model="x" * 300))
    assert pools(p) == ((32, 900), (32, 900))
    fp = p.engine_watch.fingerprint()
    assert fp is not None and fp.model == "x" * 200  # a label, cut
    p.feed(scrape(100.5, 16, 900, model="y"))
    fp = p.engine_watch.fingerprint()
    assert fp is not None and fp.model == "y"  # a renamed model is seen at once
