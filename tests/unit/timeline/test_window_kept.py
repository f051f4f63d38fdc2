"""What the timeline keeps as its window changes, checked against the walks over every step held they replace,
after every batch of a live-like feed with eviction (small windows): the step records and their ends (and the
end_ms the preemption inference bisects), the token budget's chunk cuts, the membership quality, and the
block-seconds of a few requests over the steps that can hold them; and the attribution pass's shared-block
lookup against a dict built over every step."""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest

from attrib_agent.attribution.causes import SharedBlocks
from attrib_agent.events import Event
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline import EngineTimeline
from attrib_agent.timeline.engine_timeline import DEFAULT_TOKEN_BUDGET, MembershipQuality, _cut_size
from attrib_agent.timeline.ledger import block_seconds
from benchmarks._gpu_rate import GPU_RATE_SOURCES, build_gpu_rate, load_source
from benchmarks._recordings import FIXTURES

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


@cache
def gpu_rate(tmp: Path) -> tuple[Event, ...]:
    info = build_gpu_rate(tmp, duration_s=3.0, sources=[load_source(FIXTURES / n) for n in GPU_RATE_SOURCES])
    return tuple(ReplaySource(info.path).events())


def walked(tl: EngineTimeline, rng: random.Random) -> None:
    outcomes = tl.outcomes()
    records = [o.record for _, o in outcomes]
    assert tl.steps() == records and all(a is b for a, b in zip(tl.steps(), records, strict=True))
    assert tl.step_ends() == [r.end_ts for r in records]
    assert tl._window.ends_ms()[:len(outcomes)] == [si.end_ms for si, _ in outcomes]
    assert len(tl._window.ends_ms()) == len(tl._window)
    cut = max((_cut_size(a, b) for a, b in zip(records, records[1:], strict=False)), default=0)
    tl._budget = None  # asked again at this version: worked out from what the window kept
    assert tl.token_budget() == (cut or max(tl._window.largest_step(), DEFAULT_TOKEN_BUDGET))
    errors = [r.membership_error for r in records]
    assert tl.membership_quality() == (MembershipQuality(len(errors), sum(e == 0 for e in errors) / len(errors),
                                                         sum(errors) / len(errors), max(errors))
                                       if errors else MembershipQuality(0, 0.0, 0.0, 0))
    ids = [lc.request_id for lc in tl.lifecycles()]
    for _ in range(3):
        some = rng.sample(ids, min(len(ids), rng.randint(1, 6)))
        assert tl.block_seconds(some) == block_seconds(outcomes, some)
    shared = SharedBlocks(outcomes, tl.step_ends())
    by_dict = {(o.record.iteration, o.record.end_ts): o for _, o in outcomes if o.prefix_shares}
    for _, o in rng.sample(outcomes, min(len(outcomes), 50)):
        key = (o.record.iteration, o.record.end_ts)
        want = by_dict.get(key)
        split = want.kv_split() if want is not None else None
        assert shared.get(key) == ((dict(split.exclusive), split.twice) if split and split.shared else None)


@pytest.mark.parametrize("name", ["preempt", "preempt-steps", "bench-prefix-steps", "gpu-rate"])
def test_kept_answers_equal_the_walks(name: str, tmp_path_factory: pytest.TempPathFactory) -> None:
    evs = gpu_rate(tmp_path_factory.mktemp("gpu")) if name == "gpu-rate" else \
        tuple(ReplaySource(RECORDINGS / name).events())
    tl = EngineTimeline(max_steps=512, checkpoint_every=32, keep_s=2.0)  # small: the window moves all along
    rng = random.Random(7)
    batch = max(len(evs) // 60, 10)
    dropped = False
    for i in range(0, len(evs), batch):
        tl.feed_all(evs[i:i + batch])
        walked(tl, rng)
        dropped = dropped or tl._window.first_seq > 0
    assert dropped, "the window never moved: the test checks nothing of eviction"
    assert len(tl._window._cuts) == len(tl._window) and len(tl._window._records) == len(tl._window)
