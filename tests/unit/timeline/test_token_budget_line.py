"""vLLM's start-up line `Chunked prefill is enabled with max_num_batched_tokens=N.` gives the step budget before
any step fills it. Driven by a recorded start-up (tests/fixtures/vllm-startup/budget-4096.log: the lab's vLLM 0.32
started with --max-num-batched-tokens 4096, the server that recorded the held-out truth whale2-b4096's first recording)
and that truth's w2-only recording, in which no step fills the budget before the whale arrives. Re-recorded by
truth13, the recording now opens with the line itself (the lab's capture keeps it): read without it, the line is left
out of the replay."""

from __future__ import annotations

import re
from datetime import UTC, datetime
from pathlib import Path

from attrib_agent.attribution.forecast import Candidate, ForecastConfig, forecast
from attrib_agent.attribution.forecast_state import engine_state, forecast_cost
from attrib_agent.events import Event, RequestReceived, TokenBudgetLine
from attrib_agent.health import SourceHealth
from attrib_agent.lab.score import spec_ids
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import Recording
from attrib_agent.sources.log.parser import LogLineParser
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import EngineTimeline

FIXTURES = Path(__file__).parents[2] / "fixtures"
STARTUP = FIXTURES / "vllm-startup" / "budget-4096.log"
W2_ALONE = FIXTURES / "truth" / "whale2-b4096" / "runs" / "w2-r0"
STAMP = re.compile(r"(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\.\d{3})")


def startup_events() -> tuple[list[Event], SourceHealth]:
    """The start-up log's lines through the live parser, each received at its own stamp (else the last one's)."""
    health = SourceHealth("vllm_log")
    parser = LogLineParser(health)
    out: list[Event] = []
    ts = 0.0
    for line in STARTUP.read_text().splitlines():
        if m := STAMP.search(line):
            ts = datetime.strptime(m[1], "%Y-%m-%d %H:%M:%S.%f").replace(tzinfo=UTC).timestamp()
        out += parser.parse_all(line, ts)
    return out, health


def test_the_startup_log_names_the_budget_once_and_nothing_else() -> None:
    events, health = startup_events()
    assert [type(e) for e in events] == [TokenBudgetLine]
    assert isinstance(events[0], TokenBudgetLine) and events[0].token_budget == 4096
    assert health.skipped["unknown_line"] >= 50 and not any(k.startswith("malformed") for k in health.skipped)


def test_the_timeline_reads_the_announced_budget_and_the_operators_setting_wins() -> None:
    (line,), _ = startup_events()
    told = EngineTimeline()
    assert told.token_budget() == 2048  # nothing seen: vLLM's smallest default
    told.feed(line)
    assert told.token_budget() == 4096
    configured = EngineTimeline(token_budget=1024)
    configured.feed(line)
    assert configured.token_budget() == 1024


def forecast_w2(with_startup: bool) -> dict[str, object]:
    """The forecast of admitting w2 as it arrives in its w2-only run, with the start-up log read or with no budget
    line at all (the recording's own left out)."""
    p = AttributionPipeline()
    if with_startup:
        p.feed_all(startup_events()[0])
    spec = spec_ids(Recording(W2_ALONE))
    for ev in ReplaySource(W2_ALONE).events():
        if isinstance(ev, RequestReceived) and spec.get(ev.request_id) == "w2":
            state = engine_state(p)
            assert state is not None
            got = forecast(state, [Candidate(5000, 600)], forecast_cost(p), ForecastConfig())[0]
            return got.as_dict()
        if with_startup or not isinstance(ev, TokenBudgetLine):
            p.feed(ev)
    raise AssertionError("w2 never arrives")


def test_a_whale_is_forecast_in_chunks_of_the_announced_budget() -> None:
    """No step before w2 fills the budget (shorts of 32 tokens): without the line the forecast cuts its 5,000-token
    prompt at 2,048 tokens a step; with it, at 4,096, as vLLM did (its steps: 4,095 beside s002's decode, then 905;
    4,096 then 904 in the first recording, where w2 came before s002)."""
    events = list(ReplaySource(W2_ALONE).events())
    assert isinstance(events[0], TokenBudgetLine) and events[0].token_budget == 4096  # the capture keeps the line
    steps = [e for e in events if type(e).__name__ == "EngineStep"]
    assert max(e.context_tokens for e in steps) == 4095  # type: ignore[attr-defined]
    blind, told = forecast_w2(False), forecast_w2(True)
    assert blind["price_needed"]["prefill_tokens"] == 2048  # type: ignore[index]
    assert told["price_needed"]["prefill_tokens"] == 4096  # type: ignore[index]
