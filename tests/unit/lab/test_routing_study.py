"""The routing study through its entry point at a tiny size: every request is served once, on one instance, to
its last token; the forecast policy asks the agents' API for every long request; a seed gives the same run.
And the incremental stepper it builds on schedules exactly what the oracle's one-shot run does."""

from __future__ import annotations

import json

import pytest

pytest.importorskip("vllm")

from attrib_agent.lab.oracle.compare import default_cost  # noqa: E402
from attrib_agent.lab.oracle.vllm_scheduler import VllmStepper, run_vllm  # noqa: E402
from attrib_agent.lab.oracle.workload import generate  # noqa: E402
from attrib_agent.lab.routing import study  # noqa: E402
from attrib_agent.lab.routing.workload import StudyShape, arrivals, is_long  # noqa: E402

TINY = ["--seeds", "1", "--rate", "6", "--duration", "5", "--whales", "2", "--json"]


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
