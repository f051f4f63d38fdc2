"""SIGKILL mid-run, then `attrib-agent run` again with the same --journal-dir: every result the API served as
final at least a second before the kill is served again, unchanged (the journal flushes twice a second)."""

from __future__ import annotations

import time
from typing import Any

import httpx
import pytest

from .conftest import AgentFactory
from .harness import Export, Feed, LogWriter, StandInVllm, recorded, same_result

MAX_LOSS_S = 1.0


@pytest.mark.timeout(180)
def test_sigkill_then_restart_serves_earlier_results_from_the_journal(
        agent_factory: AgentFactory, stand_in: StandInVllm, log_writer: LogWriter, tmp_path: Any) -> None:
    journal = tmp_path / "journal"
    agent = agent_factory(journal_dir=journal)
    first, second = recorded("whale1"), recorded("whale2")
    Feed(first, log_writer, stand_in, agent.otlp_url).start().join(60)
    agent.wait_final(first.span_ids)

    def post_while_up(body: bytes, export: Export) -> None:  # the feed goes on while the agent is down
        try:
            feed.post_once(body, export)
        except httpx.TransportError:
            pass

    feed = Feed(second, log_writer, stand_in, agent.otlp_url, post=post_while_up).start()
    ids = [*first.span_ids, *second.span_ids]
    seen: dict[str, tuple[float, dict[str, Any]]] = {}  # id -> (when first served final, what was served)
    deadline = time.monotonic() + 60
    while sum(rid in seen for rid in second.span_ids) < len(second.span_ids) // 2:  # a crash mid-run
        assert time.monotonic() < deadline, f"no whale2 results before the kill\n{agent.tail()}"
        for rid, body in agent.finals(ids).items():
            seen.setdefault(rid, (time.monotonic(), body))
        time.sleep(0.1)
    for rid, body in agent.finals(ids).items():
        seen.setdefault(rid, (time.monotonic(), body))
    agent.kill()
    killed_at = time.monotonic()
    assert not agent.alive

    agent.start()  # same ports, same journal
    feed.join(60)
    due = {rid: body for rid, (t, body) in seen.items() if t <= killed_at - MAX_LOSS_S}
    assert len(due) >= len(first.span_ids)
    after = agent.culprits(due)
    lost = sorted(rid for rid, r in after.items() if r.status_code != 200)
    assert not lost, f"lost {lost}\n{agent.tail()}"
    changed = sorted(rid for rid, r in after.items() if not same_result(due[rid], r.json()))
    assert not changed
    assert "journal: serving" in agent.output().split("---- start 1")[1]
    assert agent.healthy()
