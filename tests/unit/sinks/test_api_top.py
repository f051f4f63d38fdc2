"""GET /v1/culprits/top on replayed recordings: rankings that add up to the results, windows anchored at the
pipeline's event time, Prometheus-style durations, and clear 400s for bad parameters."""

from __future__ import annotations

import json
import math

import pytest
from api_replayed import call, events, midway, replayed, state_of

from attrib_agent.attribution.culprit_windows import top_of
from attrib_agent.events import RequestSpan
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.api.top import BadQuery, parse_duration


@pytest.mark.parametrize("name", ["preempt", "whale2"])
def test_ranking_adds_up_to_the_results(name: str) -> None:
    p = replayed(name)
    resp = call(api_app(state_of(p)), "/v1/culprits/top?window=1h&limit=1000")
    assert resp.status_code == 200
    body = resp.json()
    assert body["results"] == len(p.store) and body["partial_results"] == 0
    ranked = body["culprits"]
    assert [c["seconds"] for c in ranked] == sorted((c["seconds"] for c in ranked), reverse=True)
    blamed = sum(c.ttft_s + c.itl_s * r.itl_gaps for r in p.store for c in r.culprits)
    assert math.isclose(sum(c["seconds"] for c in ranked), blamed, rel_tol=1e-9)
    for c in ranked:
        assert math.isclose(sum(c["causes"].values()), c["seconds"], rel_tol=1e-9)
        assert math.isclose(c["ttft_s"] + c["itl_s"], c["seconds"], rel_tol=1e-9)
        hit = {r.request_id for r in p.store if (k := r.culprit(c["request_id"])) and k.ttft_s + k.itl_s > 0}
        assert c["victims"] == len(hit)
    whales = {r.request_id for r in p.store if r.is_whale}
    assert {c["request_id"] for c in ranked[:len(whales)]} == whales  # the whales did the damage
    assert all(c["is_whale"] for c in ranked[:len(whales)])


def test_default_window_and_limit() -> None:
    p = replayed("preempt")
    body = call(api_app(state_of(p)), "/v1/culprits/top").json()
    assert body["window_s"] == 300.0 and len(body["culprits"]) <= 10
    assert p.last_event_ts is not None
    assert body["until"] == p.last_event_ts and body["since"] == p.last_event_ts - 300.0
    one = call(api_app(state_of(p)), "/v1/culprits/top?limit=1").json()["culprits"]
    assert one == body["culprits"][:1]


def test_window_counts_only_results_that_finished_in_it() -> None:
    p = replayed("whale2")
    assert p.last_event_ts is not None
    body = call(api_app(state_of(p)), "/v1/culprits/top?window=3s").json()
    inside = [r for r in p.store if r.finished_ts >= p.last_event_ts - 3]
    assert 0 < body["results"] == len(inside) < len(p.store)
    expected = top_of(inside, 10).culprits  # a plain scan: the reference the store's index is checked against
    assert [c["request_id"] for c in body["culprits"]] == [t.request_id for t in expected]


def test_partial_results_count() -> None:
    p = midway("whale1")
    body = call(api_app(state_of(p)), "/v1/culprits/top?window=1h").json()
    assert body["partial_results"] == sum(not r.final for r in p.store) > 0
    assert body["results"] == len(p.store)


def test_empty_pipeline_has_no_culprits() -> None:
    from attrib_agent.pipeline import AttributionPipeline

    body = call(api_app(state_of(AttributionPipeline())), "/v1/culprits/top").json()
    assert body["culprits"] == [] and body["results"] == 0 and body["until"] is None


@pytest.mark.parametrize(("text", "seconds"), [("30s", 30), ("5m", 300), ("1h", 3600), ("1h30m", 5400),
                                               ("500ms", 0.5), ("2d", 172800), ("1w", 604800), ("90", 90),
                                               ("2.5", 2.5), (" 5m ", 300)])
def test_durations(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("window", ["5x", "-5m", "", "m", "0s", "0", "1e309", "nan", "inf", "5m1h", "1.5m",
                                    "31d", "5 m", "9" * 400])
def test_bad_windows_are_400(window: str) -> None:
    app = api_app(state_of(replayed("preempt")))
    resp = call(app, f"/v1/culprits/top?window={window}")
    assert resp.status_code == 400
    assert "window" in resp.json()["error"]
    assert "9" * 50 not in resp.json()["error"]
    assert app.state.api_errors["bad_query"] == 1
    with pytest.raises(BadQuery):
        parse_duration(window)


@pytest.mark.parametrize("limit", ["0", "-1", "1001", "ten", "1.5"])
def test_bad_limits_are_400(limit: str) -> None:
    resp = call(api_app(state_of(replayed("preempt"))), f"/v1/culprits/top?limit={limit}")
    assert resp.status_code == 400
    assert "limit" in resp.json()["error"]


def test_victim_seconds_is_ttft_plus_decode_time() -> None:
    r = next(r for r in replayed("preempt").store if r.ttft_slowdown_s > 0 and r.itl_slowdown_s > 0)
    assert r.victim_seconds() == r.ttft_slowdown_s + r.itl_slowdown_s * (r.completion_tokens - 1)  # type: ignore[operator]


def test_answers_are_kept_per_state_version_and_rebuilt_after_a_change() -> None:
    """`top` is built once per pipeline version and query (render_cache.py): the same bytes until the state
    changes, then the new state's answer; and the kept answer is what the state says (identical JSON)."""
    evs = events("preempt")
    cut = max(i for i, ev in enumerate(evs) if isinstance(ev, RequestSpan))  # the last span lands after this
    p = AttributionPipeline()
    p.feed_all(evs[:cut])
    p.settle()
    state = state_of(p)
    app = api_app(state)
    first = call(app, "/v1/culprits/top?window=1h&limit=50")
    assert call(app, "/v1/culprits/top?window=1h&limit=50").content == first.content
    since, until, top = state.top_culprits(3600.0, 50)
    assert first.json() == json.loads(json.dumps({
        "window_s": 3600.0, "since": since, "until": until, "results": top.results,
        "partial_results": top.partial_results, "culprits": [t.as_dict() for t in top.culprits]}))
    p.feed_all(evs[cut:])
    p.settle()
    after = call(app, "/v1/culprits/top?window=1h&limit=50").json()
    assert after["results"] == len(p.store) > first.json()["results"]

