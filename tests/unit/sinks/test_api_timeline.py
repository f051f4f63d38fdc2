"""GET /v1/timeline on replayed recordings: the steps, the compressed KV ledger, the lanes and the victims
agree with the pipeline's own timeline, and every part of the response is bounded."""

from __future__ import annotations

import gzip
import json
from dataclasses import replace
from typing import Any

import pytest
from api_replayed import call, events, midway, replayed, state_of

from attrib_agent.events import RequestReceived
from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.api.timeline import timeline_json


def timeline(p: AttributionPipeline, query: str = "") -> dict[str, Any]:
    resp = call(api_app(state_of(p)), f"/v1/timeline{query}")
    assert resp.status_code == 200, resp.text
    body: dict[str, Any] = resp.json()
    return body


def held(body: dict[str, Any], ts: float) -> dict[str, int]:
    """Blocks per request at a step end, from the change points."""
    out = {}
    for rid, points in body["kv"].items():
        last = [b for t, b in points if t <= ts]
        if last and last[-1] > 0:
            out[rid] = last[-1]
    return out


@pytest.mark.parametrize("name", ["preempt", "whale2"])
def test_steps_and_kv_ledger_match_the_timeline(name: str) -> None:
    p = replayed(name)
    body = timeline(p)
    steps = p.timeline.steps()
    assert not body["truncated"] and len(body["steps"]) == len(steps)
    assert (body["block_size"], body["pool_blocks"]) == p.timeline.pool()
    assert body["token_budget"] == p.timeline.token_budget() == 2048  # both ran vLLM CPU's default budget
    for got, rec in zip(body["steps"], steps, strict=True):
        assert got["ts"] == rec.end_ts and got["iteration"] == rec.iteration
        by_phase: dict[str, list[str]] = {}
        for m in rec.members:
            by_phase.setdefault(m.phase, []).append(m.request_id)
        assert got["members"] == by_phase
        own = p.timeline.ledger.split_at(rec.end_ts).exclusive
        assert held(body, rec.end_ts) == {k: v for k, v in own if v > 0}
    points = sum(len(v) for v in body["kv"].values())
    assert points < sum(len(s.members) for s in steps) / 5  # change points only


def test_shared_prefix_blocks_are_one_band_and_the_stack_is_the_ledger_total() -> None:
    """bench-prefix: 3 prefixes of 1,792 tokens shared by 60 requests. Each request's area is its exclusive
    blocks and `kv_shared` the shared ones, once: stacked, they are the step's `kv_blocks` (what vLLM's usage
    counts); before, every hitter's area held its whole prompt and the stack overshot vLLM by up to 56 blocks."""
    body = timeline(replayed("bench-prefix"), "?max_steps=10000")
    assert not body["truncated"]
    shared_steps = over = 0
    steps = body["steps"]
    for step in [s for s, after in zip(steps, steps[1:] + [None], strict=True) if after is None
                 or after["ts"] != s["ts"]]:  # of steps ending at the same ms, the change points give the last
        shared = [b for t, b in body["kv_shared"] if t <= step["ts"]]
        band = shared[-1] if shared else 0
        shared_steps += band > 0
        assert sum(held(body, step["ts"]).values()) + band == step["kv_blocks"]
        over += step["vllm_kv_blocks"] is not None and sum(held(body, step["ts"]).values()) + band \
            > step["vllm_kv_blocks"] + 3
    assert shared_steps >= 100  # the prefixes are shared most of the run
    assert over <= 0.05 * len(body["steps"])
    page = timeline(replayed("bench-prefix"), "?max_steps=50")  # the band is bounded by the steps sent
    assert page["truncated"] and page["kv_shared"] and len(page["kv_shared"]) <= 50
    assert all(page["steps"][0]["ts"] <= t <= page["steps"][-1]["ts"] for t, _ in page["kv_shared"])


@pytest.mark.parametrize("name", ["preempt", "whale2"])
def test_lanes_and_victims(name: str) -> None:
    p = replayed(name)
    body = timeline(p)
    lanes = {lane["request_id"]: lane for lane in body["requests"]}
    assert set(lanes) == {lc.request_id for lc in p.timeline.lifecycles()}
    for lane in lanes.values():
        times = [lane[k] for k in ("arrival_ts", "scheduled_ts", "first_token_ts", "finish_ts")]
        assert None not in times and times == sorted(times)
        assert lane["status"] == "final" and lane["complete"]
    assert {rid for rid, lane in lanes.items() if lane["is_whale"]} == {r.request_id for r in p.store if r.is_whale}
    preempted = {x.request_id for x in p.timeline.preemptions()}
    assert preempted and {rid for rid, lane in lanes.items() if lane["preemptions"]} == preempted
    victims = {v["request_id"]: v for v in body["victims"]}
    assert set(victims) == {r.request_id for r in p.store if r.culprits and r.ttft_slowdown_s + r.itl_slowdown_s > 0}
    for v in victims.values():
        seconds = [c["seconds"] for c in v["culprits"]]
        assert 0 < len(seconds) <= 3 and seconds == sorted(seconds, reverse=True)
        assert v["culprits"][0]["request_id"] in lanes
        assert v["slowdown_s"] > 0 and v["final"]


def test_newest_steps_when_truncated_without_since() -> None:
    p = replayed("preempt")
    body = timeline(p, "?max_steps=100")
    ends = [s.end_ts for s in p.timeline.steps()]
    assert body["truncated"] and body["next_since"] is None
    assert [s["ts"] for s in body["steps"]] == ends[-100:]
    assert all(lane["finish_ts"] >= body["since"] for lane in body["requests"])


@pytest.mark.parametrize(("name", "page"), [("whale2", 150), ("canary", 1), ("canary", 2), ("canary", 7)])
def test_paging_with_since_covers_every_step_once(name: str, page: int) -> None:
    """canary's log stamps tie (11 steps end in the same ms as the one before): pages never split a tie."""
    p = replayed(name)
    ends = [s.end_ts for s in p.timeline.steps()]
    seen: list[float] = []
    since = ends[0]
    for _ in range(len(ends)):
        body = timeline(p, f"?since={since!r}&max_steps={page}")
        assert len(body["steps"]) <= page or len(set(s["ts"] for s in body["steps"])) == 1
        seen += [s["ts"] for s in body["steps"]]
        if body["next_since"] is None:
            break
        since = body["next_since"]
    assert seen == ends


def test_member_budget_bounds_big_batches() -> None:
    p = replayed("preempt")
    members = [len(s.members) for s in p.timeline.steps()]
    body = timeline_json(p, None, None, max_members=500)
    sent = members[-len(body["steps"]):]
    assert body["truncated"] and sum(sent) <= 500 < sum(members[-len(body["steps"]) - 1:])


def test_since_until_filter() -> None:
    p = replayed("preempt")
    ends = [s.end_ts for s in p.timeline.steps()]
    lo, hi = ends[200], ends[400]
    body = timeline(p, f"?since={lo!r}&until={hi!r}")
    assert [s["ts"] for s in body["steps"]] == ends[200:401]
    assert timeline(p, f"?since={ends[-1] + 100}")["steps"] == []


def test_midway_lanes_show_running_requests() -> None:
    p = midway("whale1")
    body = timeline(p)
    statuses = {lane["status"] for lane in body["requests"]}
    assert {"running", "partial"} <= statuses
    assert any(not v["final"] for v in body["victims"])


def test_lanes_are_bounded() -> None:
    p = replayed("preempt")
    body = timeline_json(p, None, None, max_requests=5)
    assert len(body["requests"]) == 5 and body["truncated"]
    assert set(body["kv"]) <= {lane["request_id"] for lane in body["requests"]}
    assert {v["request_id"] for v in body["victims"]} <= {lane["request_id"] for lane in body["requests"]}


def test_empty_pipeline() -> None:
    body = timeline(AttributionPipeline())
    assert body["steps"] == [] and body["requests"] == [] and body["kv"] == {} and body["since"] is None
    assert body["kv_shared"] == []


def test_live_flag_tells_the_page_to_poll() -> None:
    p = replayed("preempt")
    assert timeline(p)["live"] is False
    live = call(api_app(state_of(p, health={"vllm_metrics": SourceHealth("vllm_metrics")})), "/v1/timeline")
    assert live.json()["live"] is True


@pytest.mark.parametrize("query", ["?since=abc", "?since=nan", "?since=-1", "?until=inf", "?since=10&until=5",
                                   "?max_steps=0", "?max_steps=10001", "?max_steps=x", "?since=" + "9" * 400])
def test_bad_parameters_are_400(query: str) -> None:
    app = api_app(state_of(replayed("preempt")))
    resp = call(app, f"/v1/timeline{query}")
    assert resp.status_code == 400
    assert set(resp.json()) == {"error"} and "9" * 50 not in resp.json()["error"]


def test_response_is_gzipped_for_clients_that_ask() -> None:
    app = api_app(state_of(replayed("preempt")))
    plain = call(app, "/v1/timeline", headers={"Accept-Encoding": "identity"})
    zipped = call(app, "/v1/timeline", headers={"Accept-Encoding": "gzip"})
    assert zipped.headers["content-encoding"] == "gzip"
    assert json.loads(zipped.content) == plain.json()  # httpx decodes; the wire size is what gzip saves
    assert len(gzip.compress(plain.content)) < len(plain.content) / 5


PHANTOM = "tokenize-9f2c0d"


def with_tokenize_call(name: str) -> AttributionPipeline:
    """The recording with a client's `/tokenize` call at its start (as `vllm bench serve` makes): vLLM logs
    `Received request tokenize-...` and nothing else for it. It used to stay "running" for ever, take a lane
    that ran on to "now" and stretch the page's axis."""
    evs = events(name)
    p = AttributionPipeline()
    p.feed(RequestReceived(ts=evs[0].ts, log_ts=None, request_id=PHANTOM, max_tokens=None))
    p.feed_all(evs)
    p.settle()
    return p


def test_requests_that_never_entered_the_engine_get_no_lane() -> None:
    p = with_tokenize_call("whale2")
    body = timeline(p, "?window=2m")
    ids = {lane["request_id"] for lane in body["requests"]}
    assert PHANTOM not in ids
    assert ids == {lc.request_id for lc in replayed("whale2").timeline.lifecycles()}


def test_window_keeps_the_last_seconds_before_the_newest_step() -> None:
    p = replayed("whale2")
    ends = [si.end_ts for si, _ in p.timeline.outcomes()]
    span = ends[-1] - ends[0]
    body = timeline(p, f"?window={span / 2!r}")
    floor = ends[-1] - span / 2
    assert body["window_start"] == pytest.approx(floor) and body["window_s"] == pytest.approx(span / 2)
    assert [s["ts"] for s in body["steps"]] == [t for t in ends if t >= floor]
    assert all(lane["finish_ts"] is None or lane["finish_ts"] >= body["since"] for lane in body["requests"])
    assert len(body["requests"]) < len(list(p.timeline.lifecycles()))  # the first half's requests are gone
    assert timeline(p, "?window=1h")["steps"] == timeline(p)["steps"]  # all of it: the window is not "now"


@pytest.mark.parametrize("window", ["0", "-5", "x", "nan", "2d1x"])
def test_bad_window_is_400(window: str) -> None:
    resp = call(api_app(state_of(replayed("whale2"))), f"/v1/timeline?window={window}")
    assert resp.status_code == 400 and "window" in resp.json()["error"]


def test_a_sighting_below_the_actionable_bar_is_listed_but_not_called_a_preemption(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The page hatches (and an operator acts on) only corroborated sightings; a lone count gap is shown as a
    doubt, with its confidence."""
    p = AttributionPipeline()
    p.feed_all(events("preempt"))
    p.settle()
    [real] = p.timeline.preemptions()
    other = next(lc.request_id for lc in p.timeline.lifecycles() if lc.request_id != real.request_id)
    weak = replace(real, request_id=other, confidence=0.5, evidence=("count_gap",), resumed_iteration=None,
                   resumed_ts=None)
    monkeypatch.setattr(p.timeline, "preemptions", lambda: [real, weak])
    lanes = {lane["request_id"]: lane for lane in timeline(p)["requests"]}
    assert [x["actionable"] for x in lanes[real.request_id]["preemptions"]] == [True]
    assert [(x["actionable"], x["confidence"]) for x in lanes[other]["preemptions"]] == [(False, 0.5)]
