"""The routing study through its entry point at a tiny size: every request is served once, on one instance, to
its last token; the forecast policy asks the agents' API for every long request; a seed gives the same run.
And the incremental stepper it builds on schedules exactly what the oracle's one-shot run does."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("vllm")

from attrib_agent.lab.oracle.compare import default_cost  # noqa: E402
from attrib_agent.lab.oracle.vllm_scheduler import VllmStepper, run_vllm  # noqa: E402
from attrib_agent.lab.oracle.workload import generate  # noqa: E402
from attrib_agent.lab.routing import study  # noqa: E402
from attrib_agent.lab.routing.workload import StudyShape, arrivals, is_long  # noqa: E402

TINY = ["--seeds", "1", "--rate", "6", "--duration", "5", "--whales", "2", "--json"]


@pytest.fixture(autouse=True)
def _checkouts_example(monkeypatch: pytest.MonkeyPatch) -> None:
    """The example from this checkout, also when the package under test is an installed build (the compiled
    suite, `make unit-compiled`): a wheel does not ship examples/."""
    monkeypatch.setattr(study, "EXAMPLE", Path(__file__).resolve().parents[3] / "examples" / "route_by_forecast.py")


def _runs(capsys: pytest.CaptureFixture[str]) -> list[dict[str, object]]:
    assert study.main(TINY) == 0
    runs: list[dict[str, object]] = json.loads(capsys.readouterr().out)
    return runs


def test_tiny_study_serves_every_request_once_and_the_forecast_policy_asks_the_api(
        capsys: pytest.CaptureFixture[str]) -> None:
    runs = _runs(capsys)
    assert sorted(str(r["policy"]) for r in runs) == sorted(study.DEFAULT_POLICIES)
    reqs = arrivals(StudyShape(duration_s=5, short_rate=6, whales=2), 0)
    longs = sum(is_long(r) for r in reqs)
    assert longs == 2 and len(reqs) > 10
    for run in runs:
        served_on = run["served_on"]
        assert isinstance(served_on, dict)
        assert sorted(served_on) == sorted(r.request_id for r in reqs)
        assert all(len(on) == 1 for on in served_on.values()), run["policy"]
        assert run["unfinished"] == []
        ttfts = run["short_ttfts_s"]
        assert isinstance(ttfts, list) and len(ttfts) == len(reqs) - longs and all(0 < t < 60 for t in ttfts)
        if run["policy"] == "forecast":
            assert run["api_calls"] == 2 * longs - 2 * int(str(run["fallbacks"]))  # both agents, per long request
            assert run["api_calls"] > 0
        else:
            assert run["api_calls"] == 0
    rr = next(r for r in runs if r["policy"] == "round-robin")
    assert isinstance(rr["served_on"], dict)
    assert {on[0] for on in rr["served_on"].values()} == {0, 1}  # both instances serve


def test_a_seed_gives_the_same_study(capsys: pytest.CaptureFixture[str]) -> None:
    assert _runs(capsys) == _runs(capsys)


def test_the_stepper_advanced_arrival_by_arrival_schedules_what_one_run_does() -> None:
    w = generate("kv_exhaustion", 0, requests=12)  # a seed whose pool runs out
    whole = run_vllm(w, default_cost())
    stepper = VllmStepper(w, default_cost())
    for i, r in sorted(enumerate(w.requests), key=lambda ir: ir[1].arrival_ts):
        stepper.advance(r.arrival_ts)
        stepper.submit(r, i)
    stepper.advance()
    assert not stepper.busy and not stepper.stopped
    assert whole.steps and stepper.trace.steps == whole.steps
    assert stepper.trace.first_token_ts == whole.first_token_ts
    assert sum(len(s.preempted) for s in whole.steps) > 0  # the pool really ran out


def test_the_forecast_policy_tells_each_agent_the_prompts_it_sent_that_vllm_has_not_prefilled() -> None:
    """A whale sent a moment ago is not prefilled yet: its agent cannot see its length. The router passes what it
    sent (in_flight_prompts, through the example's `choose` and the real API), under the ids the agent knows."""
    import asyncio

    import httpx

    from attrib_agent.attribution.forecast_state import engine_state
    from attrib_agent.lab.routing.instance import Instance
    from attrib_agent.lab.routing.workload import instance_workload

    shape = StudyShape(duration_s=5, short_rate=6, whales=2)
    reqs = arrivals(shape, 0)
    first, second = [r for r in reqs if is_long(r)][:2]
    bodies: list[dict[str, object]] = []

    async def seen(request: httpx.Request) -> None:
        bodies.append(json.loads(request.content))

    instances = [Instance(instance_workload(shape, reqs), default_cost(), agent=True, on_request=seen)
                 for _ in range(2)]
    early = [r for r in reqs if r.arrival_ts < first.arrival_ts]
    assert early  # shorts came first: instance 1 serves them, so both agents have a state
    for r in [*early, first]:
        for inst in instances:
            inst.advance(r.arrival_ts)
        instances[0 if r is first else 1].submit(r)
    instances[0].feed_agent(first.arrival_ts)  # the whale's arrival lines, no prefill step yet
    assert study.sent_not_finished(instances[0]) == {first.request_id: first.prompt_tokens}
    pipeline = instances[0].pipeline
    assert pipeline is not None
    blind, told = engine_state(pipeline), engine_state(pipeline, prompts=study.sent_not_finished(instances[0]))
    assert blind is not None and told is not None
    assert [r.prompt_tokens for r in told.requests] == [first.prompt_tokens]  # the ids match the agent's
    assert [r.prompt_tokens for r in blind.requests] != [first.prompt_tokens]  # without them: a guess

    router = study.Router("forecast")

    async def route() -> int:
        try:
            return await router.route(second, instances, first.arrival_ts)
        finally:
            for inst in instances:
                await inst.close()

    assert asyncio.run(route()) in (0, 1) and router.fallbacks == 0  # both agents answered
    assert {first.request_id: first.prompt_tokens} in [b.get("in_flight_prompts") for b in bodies]
    assert all(b["prompt_tokens"] == second.prompt_tokens for b in bodies) and len(bodies) == 2
