"""The step-cost fit kept across restarts (`state_dir`), through the agent: one replay writes it, the next agent
loads it and forecasts from it; broken, foreign and mismatched files start cold, counted and logged, never fatal."""

from __future__ import annotations

import asyncio
import json
import logging
from pathlib import Path
from typing import Any

import httpx
import pytest

from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.fit_store import FitStore, state_file
from attrib_agent.agent.replay import replay_into
from attrib_agent.attribution.cost_model import StepCostModel
from attrib_agent.attribution.fit_snapshot import MAX_BYTES
from attrib_agent.attribution.forecast_state import ScaledCost, forecast_cost, prior_shape
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import Event, RequestReceived
from attrib_agent.lab.score import spec_ids
from attrib_agent.recording import Recording
from attrib_agent.sources.replay import ReplaySource

RUNS = Path(__file__).resolve().parents[2] / "fixtures" / "truth" / "preempt" / "runs"
EARLIER, LATER = RUNS / "none-r0", RUNS / "w1-r0"  # the same machine and vLLM, one run after the other


def agent(state_dir: Path | None) -> AgentCore:
    return AgentCore.from_config(AgentConfig(state_dir=state_dir), live=False)


def saved(tmp_path: Path) -> Path:
    """An agent replays the earlier run and exits: the state file it leaves."""
    core = agent(tmp_path)
    asyncio.run(replay_into(core, EARLIER))
    core.shutdown()
    return state_file(tmp_path, 0)


def until_whale(recording: Path) -> list[Event]:
    spec = spec_ids(Recording(recording))
    events = list(ReplaySource(recording).events())
    return events[:next(i for i, ev in enumerate(events)
                        if isinstance(ev, RequestReceived) and spec.get(ev.request_id) == "w1")]


def forecast(core: AgentCore, events: list[Event]) -> dict[str, Any]:
    for ev in events:
        core.process(ev)

    async def ask() -> dict[str, Any]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=core.asgi_app(None)),
                                     base_url="http://agent") as client:
            r = await client.post("/v1/forecast", json={"prompt_tokens": 6000, "max_tokens": 64})
            assert r.status_code == 200
            out: dict[str, Any] = r.json()["forecasts"][0]
            return out

    return asyncio.run(ask())


def test_a_restarted_agent_forecasts_from_the_fit_the_last_one_saved(tmp_path: Path) -> None:
    path = saved(tmp_path)
    written = json.loads(path.read_bytes())
    assert written["engine"]["device"] == "CPU" and written["engine"]["block_size"] > 0
    assert 0 < len(written["fit"]["rows"]) <= 1024 and not list(tmp_path.glob("*.tmp"))
    before = tuple(written["fit"]["coefficients"])

    events = until_whale(LATER)
    restarted, cold = agent(tmp_path), agent(None)
    warm_answer, cold_answer = forecast(restarted, events), forecast(cold, events)
    cost = restarted.pipeline.attributor.cost
    assert restarted.state.health["fit_state"].ok_total == 1  # loaded
    assert cost.fitted and not cold.pipeline.attributor.cost.fitted  # the whale arrives before the first fit
    assert tuple(cost.coefficients.as_tuple()) == before  # priced as the last agent had learnt, until it refits
    # the forecast prices with the adopted fit, not the prior the cold agent has: the earlier run's prompts were
    # all short, so its prefill by the prior's shape at the pace the fit read (no step of this run yet)
    priced = forecast_cost(restarted.pipeline)
    shape = prior_shape(cost, restarted.pipeline.timeline.token_budget())
    assert isinstance(priced, ScaledCost) and priced.cost is cost and priced.shape == shape and shape is not None
    assert priced.prefill == 1.0 and cost.prior_pace != 1.0
    assert warm_answer["own_ttft_s"] != cold_answer["own_ttft_s"] and warm_answer != cold_answer


def test_the_restarted_agent_keeps_learning_and_saves_both_runs(tmp_path: Path) -> None:
    path = saved(tmp_path)
    first = json.loads(path.read_bytes())["fit"]
    core = agent(tmp_path)
    asyncio.run(replay_into(core, LATER))
    core.shutdown()
    second = json.loads(path.read_bytes())["fit"]
    own = core.pipeline.attributor.cost.steps_seen
    assert len(second["rows"]) == min(1024, len(first["rows"]) + own)
    # the earlier run's long prefill steps are still kept past the window, numbered before this run's
    assert second["steps_seen"] > own
    assert all(0 <= r[0] < second["steps_seen"] for k in second["kept"] for r in k)  # reloadable: from 0 again
    again = StepCostModel()
    again.restore(second)
    assert again.fitted and again.coefficients == core.pipeline.attributor.cost.coefficients


def _broken(path: Path) -> dict[str, bytes]:
    good = path.read_bytes()
    doc = json.loads(good)
    other = json.loads(good)
    other["engine"]["num_blocks"] += 1
    future = dict(doc, version=99)
    bad_row = json.loads(good)
    bad_row["fit"]["rows"][0][-1] = -1.0
    bad_load = json.loads(good)
    bad_load["load"]["rate_per_s"] = "fast"
    return {"invalid": b"\x00garbage\xff", "invalid-truncated": good[: len(good) // 2],
            "invalid-version": json.dumps(future).encode(), "mismatch": json.dumps(other).encode(),
            "invalid-row": json.dumps(bad_row).encode(), "invalid-large": b" " * (MAX_BYTES + 1),
            "invalid-load": json.dumps(bad_load).encode()}


@pytest.mark.parametrize("case", ["invalid", "invalid-truncated", "invalid-version", "mismatch", "invalid-row",
                                  "invalid-large", "invalid-load"])
def test_a_broken_or_foreign_state_file_starts_cold_counted_and_is_replaced(
        tmp_path: Path, case: str, caplog: pytest.LogCaptureFixture) -> None:
    path = saved(tmp_path)
    path.write_bytes(_broken(path)[case])
    with caplog.at_level(logging.WARNING, logger="attrib_agent"):
        core = agent(tmp_path)
        for ev in until_whale(LATER):
            core.process(ev)
    kind = case.split("-")[0]
    assert core.state.health["fit_state"].skipped[kind] == 1
    assert not core.pipeline.attributor.cost.fitted and core.pipeline.attributor.cost.window_steps == 0
    assert core.pipeline.engine_watch.arrivals is None  # nor the load saved with it
    assert any("starting from the prior" in r.getMessage() for r in caplog.records)
    asyncio.run(replay_into(core, LATER))
    core.shutdown()  # this engine's own fit replaces the file
    assert json.loads(path.read_bytes())["fit"]["steps_seen"] == core.pipeline.attributor.cost.steps_seen


def test_a_fit_adopted_before_the_first_step_is_dropped_when_the_step_shows_another_device(tmp_path: Path) -> None:
    path = saved(tmp_path)
    doc = json.loads(path.read_bytes())
    doc["engine"]["device"] = "GPU"
    path.write_text(json.dumps(doc))
    core = agent(tmp_path)
    events = list(ReplaySource(LATER).events())
    for ev in events:
        core.process(ev)
        if core.pipeline.engine_watch.device is not None:
            break
    health = core.state.health["fit_state"]
    assert health.ok_total == 1 and health.skipped["mismatch"] == 1  # adopted at the scrape, then dropped
    cost = core.pipeline.attributor.cost
    assert not cost.fitted and all(seq >= 0 for seq, _, _ in cost._rows)


def test_an_unwritable_state_dir_is_counted_not_fatal(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    core = agent(None)
    store = FitStore(blocker / "sub", core.pipeline, save_interval_s=1.0)
    core.add_sink(store)
    asyncio.run(replay_into(core, EARLIER))
    core.shutdown()
    assert store.health.skipped["write_error"] >= 1 and store.verdict == "read_error"


def test_no_state_dir_no_store() -> None:
    core = agent(None)
    assert core.sinks.get("fit_state") is None and "fit_state" not in core.state.health


def test_the_fit_is_saved_every_interval_while_it_changes(tmp_path: Path) -> None:
    now = [0.0]
    core = agent(None)
    store = FitStore(tmp_path, core.pipeline, save_interval_s=60.0, clock=lambda: now[0])
    core.add_sink(store)
    for ev in ReplaySource(EARLIER).events():
        core.process(ev)
    core.flush()
    assert not state_file(tmp_path, 0).exists()  # not due yet
    now[0] = 61.0
    core.flush()
    first = json.loads(state_file(tmp_path, 0).read_bytes())["fit"]["steps_seen"]
    assert first == core.pipeline.attributor.cost.steps_seen > 0
    now[0] = 122.0
    assert store.save() is False  # nothing learnt since: not written again
    for ev in ReplaySource(LATER).events():  # the same engine, later (its times follow the earlier run's)
        core.process(ev)
    now[0] = 183.0
    core.flush()
    assert json.loads(state_file(tmp_path, 0).read_bytes())["fit"]["steps_seen"] > first


def test_a_restarted_agent_expects_the_traffic_the_last_one_saw_until_it_sees_its_own(tmp_path: Path) -> None:
    """preempt's whales come 0.2 s into a run, before any short: a fresh agent knows nobody to expect (it runs the
    probe); one restarted on the last run's state expects that run's short stream, then its own arrivals with
    the saved stream filling the part of the window it has not watched."""
    path = saved(tmp_path)
    load = json.loads(path.read_bytes())["load"]
    earlier = [ev for ev in ReplaySource(EARLIER).events() if isinstance(ev, RequestReceived)]
    span = earlier[-1].ts - earlier[0].ts
    assert load["rate_per_s"] == pytest.approx((len(earlier) - 1) / span, rel=0.25)  # its shorts, not a quiet end
    assert load["prompt_tokens"] == 32 and load["max_tokens"] > 0

    events = until_whale(LATER)
    restarted, cold = agent(tmp_path), agent(None)
    warm_answer, cold_answer = forecast(restarted, events), forecast(cold, events)
    # cold: nobody known to come, so one probe arrival (it says what the next request waits), said so
    assert cold_answer["expected_load"] is None and cold_answer["expected_arrivals"]["requests"] == 1
    assert cold_answer["load_basis"] == "probe" and cold_answer["expected_arrivals"]["ttft_extra_sum_s"] > 0.05
    assert warm_answer["expected_load"]["rate_per_s"] == pytest.approx(load["rate_per_s"])
    assert warm_answer["load_basis"] == "saved"
    assert warm_answer["expected_arrivals"]["ttft_extra_sum_s"] > 0  # harm to those the stream brings

    # once this run's own arrivals are seen, they count, the saved load filling the window's unwatched part
    rest = list(ReplaySource(LATER).events())[len(events):]
    own = [i for i, ev in enumerate(rest) if isinstance(ev, RequestReceived)]
    later = forecast(restarted, rest[: own[3] + 1])
    assert later["expected_load"]["rate_per_s"] != pytest.approx(load["rate_per_s"])
    assert later["load_basis"] == "learnt+saved"  # ... blended until it has watched a window of its own

