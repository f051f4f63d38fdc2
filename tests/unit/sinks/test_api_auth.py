"""Bearer-token auth, the probes, the /metrics mount and JSON errors, on a replayed state."""

from __future__ import annotations

import pytest
from api_replayed import call, replayed, state_of
from prometheus_client import CollectorRegistry, PlatformCollector, make_asgi_app

from attrib_agent.health import SourceHealth
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.sinks.api.app import api_app

TOKEN = "s3cret-token"
DATA_PATHS = ["/v1/culprits/top", "/v1/timeline", "/metrics"]


def metrics_app() -> object:
    registry = CollectorRegistry()
    PlatformCollector(registry=registry)
    return make_asgi_app(registry)


def app_with(token: str | None = TOKEN):  # type: ignore[no-untyped-def]
    return api_app(state_of(replayed("preempt")), token=token, metrics_app=metrics_app())  # type: ignore[arg-type]


def victim_path() -> str:
    return f"/v1/requests/{next(iter(replayed('preempt').store)).request_id}/culprits"


def test_without_token_everything_is_open() -> None:
    app = app_with(None)
    for path in [*DATA_PATHS, victim_path(), "/healthz", "/readyz", "/"]:
        assert call(app, path).status_code == 200, path


@pytest.mark.parametrize("header", [None, "Bearer wrong", f"Basic {TOKEN}", TOKEN, "Bearer", f"Bearer {TOKEN}x",
                                    f"Bearer {TOKEN[:-1]}", "Bearer " + "A" * 10_000])
def test_data_needs_the_token(header: str | None) -> None:
    app = app_with()
    for path in [*DATA_PATHS, victim_path()]:
        resp = call(app, path, headers={"Authorization": header} if header else None)
        assert resp.status_code == 401, path
        assert resp.json() == {"error": "missing or wrong bearer token"}
        assert resp.headers["www-authenticate"].startswith("Bearer")
    assert app.state.api_errors["unauthorized"] == len(DATA_PATHS) + 1


@pytest.mark.parametrize("scheme", ["Bearer", "bearer", "BEARER"])
def test_right_token_opens_the_data(scheme: str) -> None:
    app = app_with()
    for path in [*DATA_PATHS, victim_path()]:
        assert call(app, path, headers={"Authorization": f"{scheme} {TOKEN}"}).status_code == 200, path


def test_probes_and_page_shell_need_no_token() -> None:
    app = app_with()
    assert call(app, "/healthz").json()["status"] == "ok"
    assert call(app, "/readyz").status_code == 200
    ids = [r.request_id for r in replayed("preempt").store]
    for path in ["/", "/page/page.js", "/page/draw.js", "/page/page.css"]:
        resp = call(app, path)
        assert resp.status_code == 200
        assert not any(rid in resp.text for rid in ids)  # the shell holds no data
    assert "script-src 'self'" in call(app, "/").headers["content-security-policy"]
    assert call(app, "/?token=wrong").status_code == 200  # the query token is the page's business, not auth
    assert call(app, "/v1/timeline?token=" + TOKEN).status_code == 401  # the API takes only the header


def test_metrics_mount_serves_the_given_app() -> None:
    resp = call(app_with(None), "/metrics")
    assert resp.status_code == 200 and "python_info" in resp.text
    no_metrics = api_app(state_of(replayed("preempt")))
    assert call(no_metrics, "/metrics").status_code == 404


def test_readyz_says_what_is_missing() -> None:
    p = replayed("preempt")
    down = SourceHealth("vllm_metrics")
    down.error("refused", 100.0, "connection refused")
    resp = call(api_app(state_of(p, health={"vllm_metrics": down})), "/readyz")
    assert resp.status_code == 503
    assert resp.json() == {"ready": False, "missing": ["source vllm_metrics down (refused: connection refused)"],
                           "mode": "inferred", "vllm_gaps": 0, "vllm_gap_since": None, "vllm_gap_s": 0.0,
                           "pipeline": {"backlog_events": 0, "backlog_s": 0.0, "attributed_share": 1.0,
                                        "victims_skipped": 0, "degraded": False},
                           "token_budget": {"tokens": 2048, "source": "inferred"}}  # a step cut a prefill chunk
    resp = call(api_app(state_of(p, replay_done=False)), "/readyz")
    assert resp.status_code == 200  # the cost model is fitted: attribution works while the replay runs on
    fresh = AttributionPipeline()
    resp = call(api_app(state_of(fresh, health={"vllm_metrics": SourceHealth("vllm_metrics")})), "/readyz")
    assert resp.status_code == 503 and any("not fitted" in m for m in resp.json()["missing"])
    resp = call(api_app(state_of(fresh, replay_done=False)), "/readyz")
    assert resp.status_code == 503 and "replay still running" in resp.json()["missing"]
    assert call(api_app(state_of(fresh)), "/readyz").status_code == 200  # replay over: ready on the prior


def test_healthz_reports_uptime_from_the_state_clock() -> None:
    state = state_of(replayed("preempt"), clock=lambda: 1000.0, started_ts=990.0)
    assert call(api_app(state), "/healthz").json() == {"status": "ok", "version": state.version, "uptime_s": 10.0}


def test_errors_are_json_without_internals() -> None:
    app = app_with(None)
    resp = call(app, "/nope")
    assert resp.status_code == 404 and resp.json() == {"error": "not found"}
    resp = call(app, "/v1/timeline", method="POST")
    assert resp.status_code == 405 and resp.json() == {"error": "method not allowed"}
    assert call(app, "/page/secret.txt").status_code == 404

    def broken_clock() -> float:
        raise ZeroDivisionError("clock is broken")

    crashing = api_app(state_of(replayed("preempt"), clock=broken_clock))
    resp = call(crashing, "/healthz", raise_app_exceptions=False)
    assert resp.status_code == 500 and resp.json() == {"error": "internal error"}
    assert crashing.state.api_errors["internal"] == 1


def test_empty_or_unrevealed_token_is_refused_at_start() -> None:
    with pytest.raises(ValueError, match="must not be empty"):
        api_app(state_of(replayed("preempt")), token="")

    class Secret:  # what a config object holding the token looks like before it is revealed
        def __str__(self) -> str:
            return "***"

    with pytest.raises(TypeError, match="must be a str"):
        api_app(state_of(replayed("preempt")), token=Secret())  # type: ignore[arg-type]


def test_error_counter_keys_stay_a_closed_set() -> None:
    """Rejections are counted by kind, never by input: a flood of distinct bad requests adds no keys."""
    app = app_with()
    auth = {"Authorization": f"Bearer {TOKEN}"}
    for i in range(300):
        call(app, f"/v1/requests/bad%20id{i}/culprits", headers=auth)
        call(app, f"/v1/requests/unknown-{i}/culprits", headers=auth)
        call(app, f"/v1/culprits/top?window={i}x", headers=auth)
        call(app, f"/nope/{i}", headers=auth)
        call(app, f"/v1/timeline?n={i}", headers={"Authorization": f"Bearer {i}"})
    assert dict(app.state.api_errors) == {"bad_id": 300, "unknown_id": 300, "bad_query": 300, "http_404": 300,
                                          "unauthorized": 300}
