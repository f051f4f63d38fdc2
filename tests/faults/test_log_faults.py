"""The log file under the agent rotated, truncated (copytruncate), deleted and recreated, and lines arriving in
two writes, all during one recorded run: every request is still attributed, and every log line is read exactly
once (the agent's event counts equal what its parser makes of the recording's lines)."""

from __future__ import annotations

from collections import Counter

import pytest

from .conftest import AgentFactory
from .harness import AgentProcess, Feed, LogWriter, StandInVllm, log_event_counts, recorded, wait_until

LOG_KINDS = ("request_received", "request_added", "request_aborted", "request_failed", "engine_step", "stats_line")


def log_events(agent: AgentProcess) -> Counter[str]:
    m = agent.metrics()
    return Counter({k: int(m.value("attrib_events_total", kind=k)) for k in LOG_KINDS})


@pytest.mark.timeout(180)
def test_rotation_truncation_recreation_and_split_lines_lose_no_request(
        agent_factory: AgentFactory, stand_in: StandInVllm, log_writer: LogWriter) -> None:
    rec = recorded("whale1")
    agent = agent_factory()
    faults: list[str] = []
    n = len(rec.log)
    at = {n * 15 // 100: "rotate", n * 35 // 100: "truncate", n * 55 // 100: "recreate", n * 75 // 100: "split"}
    feed: Feed

    def caught_up(upto: int) -> None:
        """Wait until the agent has read every line before `upto` (copytruncate loses what was not read yet)."""
        want = log_event_counts(feed.lines[:upto])
        wait_until(lambda: log_events(agent) == want, 20, f"the agent to read the first {upto} lines",
                   interval_s=0.05, detail=lambda: f"{log_events(agent)} != {want}\n{agent.tail()}")

    def before_line(i: int, line: str, w: LogWriter) -> bool:
        fault = at.get(i)
        if fault == "rotate":  # renamed; the writer appends two more lines to the old file, then reopens
            w.rotate(then_old=[line, feed.lines[i + 1]])
            at[i + 1] = "written"
        elif fault == "truncate":
            caught_up(i)
            w.truncate()
            w.line(line)
        elif fault == "recreate":  # deleted under the writer, which writes a line to it, then a new file
            w.delete_and_recreate(then_old=[line])
        elif fault == "written":
            return False
        elif fault == "split" or i % 29 == 0:
            w.split_line(line, at=len(line) // 2, pause_s=0.3 if fault else 0.12)
        else:
            return True
        faults.append(fault or "split")
        return False

    feed = Feed(rec, log_writer, stand_in, agent.otlp_url, before_line=before_line).start()
    feed.join(90)
    assert {"rotate", "truncate", "recreate", "split"} <= set(faults)
    results = agent.wait_final(rec.span_ids)
    assert len(results) == len(rec.span_ids)
    want = log_event_counts(feed.lines)
    def missing_steps() -> str:
        steps = agent.get("/v1/timeline", since="0", max_steps="5000").json()["steps"]
        seen = Counter(s["iteration"] for s in steps)
        fed = [int(x.split("Iteration(")[1].split(")")[0]) for x in feed.lines if "Iteration(" in x]
        return f"{log_events(agent)} != {want}; steps missing {sorted(set(fed) - set(seen))}, " \
               f"twice {[k for k, v in seen.items() if v > 1]}; faults at {sorted(at.items())}"

    wait_until(lambda: log_events(agent) == want, 20, "every log line read exactly once", detail=missing_steps)
    m = agent.metrics()
    assert m.value("attrib_source_skipped_total", source="vllm_log", kind="partial_line_discarded") == 0
    assert m.value("attrib_source_up", source="vllm_log") == 1
    out = agent.output()
    assert out.count("was replaced (rotated or recreated)") == 2 and out.count("was truncated") == 1, out[-3000:]
    assert agent.healthy() and "Traceback" not in out
