"""vLLM unreachable for 60 s: the agent stays up, marks the gap (API and /metrics), counts the refused scrapes,
keeps serving what it attributed, and closes the gap when vLLM's /metrics answers again on the same port."""

from __future__ import annotations

import time

import pytest

from .conftest import AgentFactory
from .harness import Feed, LogWriter, StandInVllm, recorded, same_result, wait_until

OUTAGE_S = 60.0


@pytest.mark.timeout(240)
def test_vllm_unreachable_for_60_s_is_a_gap_that_closes_when_scrapes_succeed(
        agent_factory: AgentFactory, stand_in: StandInVllm, log_writer: LogWriter) -> None:
    agent = agent_factory()
    rec = recorded("canary")
    stand_in.play(rec)
    Feed(rec, log_writer, stand_in, agent.otlp_url).start().join(60)
    before = agent.wait_final(rec.span_ids)
    ready = agent.get("/readyz")
    assert ready.status_code == 200, ready.text
    assert ready.json()["vllm_gaps"] == 0 and ready.json()["vllm_gap_since"] is None

    stand_in.stop()  # vLLM down: its port refuses connections
    down_at = time.time()
    opened = wait_until(lambda: (r := agent.get("/readyz")).json()["vllm_gap_since"] is not None and r, 15,
                        "the agent to mark the gap", detail=agent.tail)
    assert opened.status_code == 503 and any("vllm_metrics" in m for m in opened.json()["missing"])
    assert opened.json()["vllm_gaps"] == 1
    assert down_at - 1 <= opened.json()["vllm_gap_since"] <= down_at + 5

    while time.time() - down_at < OUTAGE_S:  # the outage: the agent must stay up and keep answering throughout
        assert agent.healthy(), agent.tail()
        time.sleep(2.0)
    during = agent.metrics()
    assert during.value("attrib_vllm_gap_seconds") >= OUTAGE_S - 5
    assert during.value("attrib_vllm_gaps_total") == 1
    assert during.value("attrib_source_up", source="vllm_metrics") == 0
    # one refused scrape per poll (0.1 s): hundreds over the minute, each counted, none fatal
    assert during.value("attrib_source_errors_total", source="vllm_metrics", kind="refused") >= OUTAGE_S
    assert agent.get("/readyz").json()["vllm_gap_s"] >= OUTAGE_S - 5
    kept = agent.finals(rec.span_ids)
    assert set(kept) == set(before) and all(same_result(before[r], kept[r]) for r in before)

    stand_in.start()  # vLLM back on the same port (not restarted: same counters)
    # readiness follows the scrapes at once; the gap is closed by the agent's gap watch (every 0.25 s)
    closed = wait_until(lambda: (r := agent.get("/readyz")).status_code == 200
                        and r.json()["vllm_gap_since"] is None and r, 15,
                        "the gap to close once scrapes succeed", detail=agent.tail)
    assert closed.json()["vllm_gap_s"] == 0
    after = agent.metrics()
    assert after.value("attrib_vllm_gap_seconds") == 0
    assert after.value("attrib_vllm_gaps_total") == 1  # the one outage, counted once
    assert after.value("attrib_vllm_restarts_total") == 0
    assert after.value("attrib_source_up", source="vllm_metrics") == 1
    assert after.value("attrib_source_success_total", source="vllm_metrics") > \
        during.value("attrib_source_success_total", source="vllm_metrics")
    kept = agent.finals(rec.span_ids)
    assert set(kept) == set(before) and all(same_result(before[r], kept[r]) for r in before)
    assert agent.alive and "Traceback" not in agent.output()
