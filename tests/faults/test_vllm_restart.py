"""vLLM restarted: its /metrics counters start again lower (the stand-in switches from one recorded run to
another). The agent counts one restart (and one gap), no counter of its own goes backwards, what it attributed
before stays served, and the requests fed after the restart are attributed."""

from __future__ import annotations

import pytest

from .conftest import AgentFactory
from .harness import Feed, LogWriter, StandInVllm, recorded, same_result


@pytest.mark.timeout(180)
def test_counter_reset_is_one_restart_and_requests_after_it_are_attributed(
        agent_factory: AgentFactory, stand_in: StandInVllm, log_writer: LogWriter) -> None:
    first, second = recorded("whale2"), recorded("canary")  # whale2 ends at 23,280 prompt tokens, canary at 212
    stand_in.play(first)  # vLLM as it was before the run
    agent = agent_factory()
    Feed(first, log_writer, stand_in, agent.otlp_url).start().join(60)
    before = agent.wait_final(first.span_ids)
    m0 = agent.metrics()
    assert m0.value("attrib_vllm_restarts_total") == 0 and m0.value("attrib_vllm_gaps_total") == 0

    Feed(second, log_writer, stand_in, agent.otlp_url).start().join(60)  # the restarted vLLM's run
    after = agent.wait_final(second.span_ids)
    assert all(r["culprits"] is not None for r in after.values())
    m1 = agent.metrics()
    assert m1.value("attrib_vllm_restarts_total") == 1, agent.tail()
    assert m1.value("attrib_vllm_gaps_total") == 1  # a restart between two good scrapes is a gap too
    assert agent.get("/readyz").json()["vllm_gap_since"] is None  # ... but none is open: vLLM answers
    # No negative deltas: every counter, histogram count, sum and bucket the agent serves only went up.
    c0, c1 = m0.counters(), m1.counters()
    went_back = {k: (c0[k], c1.get(k)) for k in c0 if c1.get(k, float("-inf")) < c0[k]}
    assert not went_back
    assert m1.value("attrib_requests_attributed_total") == len(first.span_ids) + len(second.span_ids)
    assert m1.value("attrib_preemptions_inferred_total") == m0.value("attrib_preemptions_inferred_total")
    kept = agent.finals(first.span_ids)
    assert set(kept) == set(before) and all(same_result(before[r], kept[r]) for r in before)
    assert agent.alive and "Traceback" not in agent.output()
