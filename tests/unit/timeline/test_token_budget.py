"""The inferred token budget kept per step pair: the same answer as walking the window, for a fraction of it."""

from __future__ import annotations

import pytest

from attrib_agent.timeline import EngineTimeline
from attrib_agent.timeline import engine_timeline as et
from attrib_agent.timeline.model import StepRecord
from tests.unit.timeline.test_recordings import events


def walked(steps: list[StepRecord], largest: int) -> int:
    """The rule as written: the largest step that cut a prefill chunk, else the largest step (>= the default)."""
    full = 0
    for step, after in zip(steps, steps[1:], strict=False):
        still = {m.request_id for m in after.members if m.phase == "prefill"}
        if any(m.phase == "prefill" and m.request_id in still for m in step.members):
            full = max(full, step.context_tokens + step.generation_tokens)
    return full or max(largest, et.DEFAULT_TOKEN_BUDGET)


@pytest.mark.parametrize("name", ["whale1", "preempt"])
def test_budget_per_version_matches_the_walk_and_reads_only_new_pairs(name: str,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    calls = 0
    cut_size = et._cut_size

    def counted(step: StepRecord, after: StepRecord) -> int:
        nonlocal calls
        calls += 1
        return cut_size(step, after)

    monkeypatch.setattr(et, "_cut_size", counted)
    tl = EngineTimeline(max_steps=256, checkpoint_every=16)
    walked_pairs = asked = 0
    for ev in events(name):
        tl.feed(ev)
        steps = tl.steps()
        assert tl.token_budget() == walked(steps, tl._window.largest_step())
        walked_pairs += max(0, len(steps) - 1)
        asked += 1
        assert len(tl._window._cuts) <= len(steps) <= 256  # the kept cut sizes: bounded by the window
    assert calls > 0
    assert calls * 10 < walked_pairs, (calls, walked_pairs, asked)  # the walk read every pair every version
