"""`/v1/timeline` built from kept step texts (sinks/api/timeline_body.py): byte for byte the document encoded
whole, the steps it has seen not encoded again, and the kept texts bounded."""

from __future__ import annotations

import pytest
from api_replayed import events, replayed

from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.api.plumbing import json_response
from attrib_agent.sinks.api.timeline import timeline_json
from attrib_agent.sinks.api.timeline_body import StepTexts, timeline_body

EXTRA = {"live": True, "version": "test"}


def whole(p: AttributionPipeline, since: float | None, until: float | None, max_steps: int,
          window_s: float | None) -> bytes:
    return bytes(json_response(timeline_json(p, since, until, max_steps=max_steps, window_s=window_s) | EXTRA).body)


@pytest.mark.parametrize("name", ["preempt", "whale2", "bench-mixed"])
def test_the_body_is_the_whole_document_encoded(name: str) -> None:
    p = replayed(name)
    texts = StepTexts()
    ends = [si.end_ts for si, _ in p.outcomes()]
    for since, until, max_steps, window_s in [(None, None, 2000, None), (None, None, 50, None),
                                              (ends[3], None, 40, None), (None, ends[len(ends) // 2], 2000, 30.0),
                                              (ends[-1] + 1, None, 10, None)]:
        got = timeline_body(p, since, until, texts, max_steps=max_steps, window_s=window_s, extra=EXTRA)
        assert got == whole(p, since, until, max_steps, window_s)


def test_only_new_or_reinferred_steps_are_encoded_again() -> None:
    evs = events("bench-mixed")
    p = AttributionPipeline()
    p.feed_all(evs[:len(evs) // 2])
    texts = StepTexts()
    timeline_body(p, None, None, texts, max_steps=2000, window_s=None, extra=EXTRA)
    first = texts.encoded
    assert first == len(p.outcomes()) > 0
    timeline_body(p, None, None, texts, max_steps=2000, window_s=None, extra=EXTRA)
    assert texts.encoded == first  # the same steps: nothing encoded
    p.feed_all(evs[len(evs) // 2:len(evs) // 2 + 300])  # a few more steps, some re-inferred
    got = timeline_body(p, None, None, texts, max_steps=2000, window_s=None, extra=EXTRA)
    assert got == whole(p, None, None, 2000, None)
    assert texts.encoded - first < len(p.outcomes())  # the steps that stayed the same were reused


def test_kept_texts_are_bounded() -> None:
    p = replayed("preempt")
    texts = StepTexts(max_steps=10)
    got = timeline_body(p, None, None, texts, max_steps=2000, window_s=None, extra=EXTRA)
    assert len(texts) == 10 and got == whole(p, None, None, 2000, None)
    with pytest.raises(ValueError):
        StepTexts(max_steps=0)
