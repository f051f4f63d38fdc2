"""A request whose span never comes (lost, or tracing off) holds the window open from its queueing only until its
inferred finish is `open_timeout_s` old: then its steps may leave (EngineTimeline._bound, which reads that rule
inline for every request held)."""

from __future__ import annotations

from pathlib import Path

from attrib_agent.events import RequestSpan
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline import EngineTimeline

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def held(timeout_s: float) -> dict[str, int]:
    evs = [e for e in ReplaySource(RECORDINGS / "whale2").events() if not isinstance(e, RequestSpan)]
    tl = EngineTimeline(keep_s=1.0, open_timeout_s=timeout_s)
    tl.feed_all(evs)
    tl._bound()
    return tl.sizes()


def test_span_less_finishes_stop_holding_the_window_after_the_timeout() -> None:
    closed, open_ = held(1.0), held(1e9)
    assert 0 < closed["steps"] < open_["steps"]
