"""GET /v1/requests/{id}/culprits on states replayed from real recordings: final, partial, running, unknown,
the client's id forms, and ids that cannot be ids."""

from __future__ import annotations

import pytest
from api_replayed import call, midway, replayed, state_of

from attrib_agent.attribution.result_codec import from_dict, to_dict
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.api.ids import BadRequestId, check_id, id_forms, resolve


@pytest.mark.parametrize("name", ["preempt", "whale2"])
def test_every_final_result_is_served_as_its_json(name: str) -> None:
    p = replayed(name)
    app = api_app(state_of(p))
    assert len(p.store) > 20
    for r in p.store:
        resp = call(app, f"/v1/requests/{r.request_id}/culprits")
        assert resp.status_code == 200
        body = resp.json()
        assert body.pop("status") == "final"
        assert body == to_dict(r)
        assert from_dict(body) == r


def test_client_id_forms_resolve_to_vllm_ids() -> None:
    """X-Request-Id `a11e94-s003` and the response id `cmpl-a11e94-s003` both name `cmpl-a11e94-s003-0`."""
    p = replayed("preempt")
    app = api_app(state_of(p))
    victim = next(r for r in p.store if r.request_id.endswith("-s003-0"))
    client_id = victim.request_id.removeprefix("cmpl-").removesuffix("-0")
    for form in (client_id, f"cmpl-{client_id}", victim.request_id):
        resp = call(app, f"/v1/requests/{form}/culprits")
        assert resp.status_code == 200, form
        assert resp.json()["request_id"] == victim.request_id


def test_chat_completion_ids_resolve_without_suffix() -> None:
    p = replayed("canary")
    app = api_app(state_of(p))
    chat = [r.request_id for r in p.store if r.request_id.startswith("chatcmpl-")]
    assert chat
    for rid in chat:
        resp = call(app, f"/v1/requests/{rid.removeprefix('chatcmpl-')}/culprits")
        assert resp.status_code == 200
        assert resp.json()["request_id"] == rid


def test_the_engines_id_from_vllms_log_resolves_to_the_request() -> None:
    """An operator grepping vLLM's log finds `Added request cmpl-...-0-<8 hex>.`: that id names the request too."""
    p = replayed("preempt")
    app = api_app(state_of(p))
    victim = next(r for r in p.store if r.request_id.endswith("-s003-0"))
    resp = call(app, f"/v1/requests/{victim.request_id}-9f3a01bc/culprits")
    assert resp.status_code == 200
    assert resp.json()["request_id"] == victim.request_id
    assert call(app, f"/v1/requests/{victim.request_id}-9f3a01bx/culprits").status_code == 404  # not 8 hex
    # an n>1 request's child (`Added request 1_<id>-<8 hex>.`): the agent files it under its parent, as the log
    # parser does
    resp = call(app, f"/v1/requests/1_{victim.request_id}-9f3a01bc/culprits")
    assert resp.status_code == 200 and resp.json()["request_id"] == victim.request_id


def test_a_responses_api_id_resolves_to_its_first_turn() -> None:
    """vLLM sends a Responses API request to the engine as `<response id>_0` (responses/serving.py): the client
    holds `resp_<hex>`, the agent knows `resp_<hex>_0`."""
    known = {"resp_ad0524921d08b86d_0", "resp_a54a0e29ece06620_0"}
    assert resolve("resp_ad0524921d08b86d", known.__contains__).request_id == "resp_ad0524921d08b86d_0"
    assert resolve("resp_ad0524921d08b86d_0-bc9d37a2", known.__contains__).request_id == "resp_ad0524921d08b86d_0"
    assert resolve("resp_0000", known.__contains__).request_id is None


def test_partial_and_running_answer_202() -> None:
    p = midway("whale1")
    app = api_app(state_of(p))
    partial = next(r for r in p.store if not r.final)
    resp = call(app, f"/v1/requests/{partial.request_id}/culprits")
    assert resp.status_code == 202
    assert resp.json()["status"] == "partial"
    assert from_dict(resp.json()) == partial
    running = next(lc.request_id for lc in p.timeline.lifecycles() if p.status(lc.request_id) == "running")
    resp = call(app, f"/v1/requests/{running}/culprits")
    assert resp.status_code == 202
    assert resp.json() == {"request_id": running, "status": "running"}


def test_unknown_id_is_404() -> None:
    app = api_app(state_of(replayed("preempt")))
    other = next(iter(replayed("whale2").store)).request_id  # a real id, from another run
    resp = call(app, f"/v1/requests/{other}/culprits")
    assert resp.status_code == 404
    assert set(resp.json()) == {"error"}


@pytest.mark.parametrize("raw", ["x" * 257, "a%20b", "a..b", "%2e%2e", "-leading-dash", "a%00b", "a;b",
                                 "%3Cscript%3E", "a%0Ab"])
def test_ids_that_cannot_be_ids_are_400(raw: str) -> None:
    app = api_app(state_of(replayed("preempt")))
    resp = call(app, f"/v1/requests/{raw}/culprits")
    assert resp.status_code == 400
    body = resp.json()
    assert set(body) == {"error"}
    assert "<script>" not in body["error"] and "x" * 50 not in body["error"]
    assert app.state.api_errors["bad_id"] == 1


@pytest.mark.parametrize("raw", ["a/b", "..", "..%2F..%2Fetc%2Fpasswd", "%2Fetc%2Fpasswd", "a/../b"])
def test_path_like_ids_are_404(raw: str) -> None:
    app = api_app(state_of(replayed("preempt")))
    resp = call(app, f"/v1/requests/{raw}/culprits")
    assert resp.status_code in (400, 404)
    assert set(resp.json()) == {"error"}


def test_huge_id_is_rejected_before_any_lookup() -> None:
    with pytest.raises(BadRequestId, match="longer than 256"):
        resolve("a" * 100_000, lambda rid: pytest.fail("looked up a huge id"))


def test_resolve_is_exact_first_and_refuses_ambiguity() -> None:
    ids = [r.request_id for r in replayed("canary").store]  # completion (`-0`) and chat (no suffix) forms
    known = set(ids)
    for rid in ids:
        assert resolve(rid, known.__contains__).request_id == rid
    completion = next(i for i in ids if i.startswith("cmpl-"))
    bare = completion.removeprefix("cmpl-").removesuffix("-0")
    both = {completion, f"chatcmpl-{bare}"}  # the same client id used by a completion and a chat request
    found = resolve(bare, both.__contains__)
    assert found.request_id is None and set(found.candidates) == both
    assert id_forms(bare)[0] == bare and len(id_forms(bare)) == len(set(id_forms(bare)))
    assert check_id(completion) == completion
