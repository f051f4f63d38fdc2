"""Attribution invariants on random workloads of the vLLM-rules engine (fake_engine.py)."""

import pytest
from hypothesis import HealthCheck, given, settings

from attrib_agent.attribution.attributor import Attributor
from attrib_agent.timeline.engine_timeline import EngineTimeline

from .fake_engine import FakeConfig, FakeRequest, run
from .test_fake_engine_properties import scenarios

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@SETTINGS
@given(scenarios())
def test_parts_sum_no_negative_blame_and_same_live_as_replay(scenario: tuple[FakeConfig, list[FakeRequest]]) -> None:
    fr = run(*scenario)
    at_once = EngineTimeline()
    at_once.feed_all(fr.events)
    results = Attributor().attribute(at_once)
    assert {r.request_id for r in results} == {lc.request_id for lc in at_once.lifecycles() if lc.complete}
    for r in results:
        assert r.ttft_slowdown_s >= 0 and r.itl_slowdown_s >= 0
        assert r.unexplained_ttft_s >= 0 and r.unexplained_itl_s >= 0
        assert sum(c.ttft_s for c in r.culprits) + r.unexplained_ttft_s == pytest.approx(r.ttft_slowdown_s, abs=1e-9)
        assert sum(c.itl_s for c in r.culprits) + r.unexplained_itl_s == pytest.approx(r.itl_slowdown_s, abs=1e-9)
        assert all(c.ttft_s >= 0 and c.itl_s >= 0 and c.request_id != r.request_id for c in r.culprits)
        assert 0.0 <= r.quality <= 1.0
    one_by_one = EngineTimeline()
    for ev in fr.events:
        one_by_one.feed(ev)
    again = Attributor().attribute(one_by_one)
    assert sorted(again, key=lambda r: r.request_id) == sorted(results, key=lambda r: r.request_id)
