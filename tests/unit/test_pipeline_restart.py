"""vLLM killed mid-run and started again: the request it was serving never gets a span or an abort line. The
agent ends it at the restart (status `aborted`), so it neither holds later results partial nor gets blamed for
requests sent to the new server.

Input: the committed `whale1` recording cut off half-way through its whale's life (what a killed vLLM leaves:
nothing more in its log, no more scrapes or spans), then the `shorts` recording moved to after it, whose
iteration numbers and counters start again as a restarted vLLM's do."""

from __future__ import annotations

from pathlib import Path

import pytest

from attrib_agent.events import Event, RequestSpan
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.sources.replay import ReplaySource
from benchmarks._recordings import build_concatenated, load_sources

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "recordings"


@pytest.fixture(scope="module")
def killed_then_restarted(tmp_path_factory: pytest.TempPathFactory) -> tuple[list[Event], str, float, float]:
    by_name = {s.path.name: s for s in load_sources([FIXTURES / "whale1", FIXTURES / "shorts"])}
    whale1, shorts = by_name["whale1"], by_name["shorts"]
    built = build_concatenated(tmp_path_factory.mktemp("restart"), [whale1, shorts], min_events=whale1.events + 1,
                               gap_s=30.0)
    events = list(ReplaySource(built.path).events())
    spans = [e for e in events if isinstance(e, RequestSpan)]
    whale = next(s for s in spans if "-w1-" in s.request_id)
    killed_at = whale.start_ts + 0.5 * (whale.end_ts - whale.start_ts)
    # the second copy starts after the 30 s gap between copies: vLLM's restart, its first scrape included
    restart_at = next(b.ts for a, b in zip(events, events[1:], strict=False) if b.ts - a.ts > 20.0)
    kept = [e for e in events if e.ts <= killed_at or e.ts >= restart_at]
    return kept, whale.request_id, killed_at, restart_at


def test_a_request_lost_in_the_crash_ends_at_the_restart(
        killed_then_restarted: tuple[list[Event], str, float, float]) -> None:
    events, lost, killed_at, restart_at = killed_then_restarted
    assert not any(isinstance(e, RequestSpan) and e.request_id == lost for e in events)
    p = AttributionPipeline(PipelineConfig(partial_timeout_s=1e6))  # final only because nobody blocks them
    for ev in events:
        p.feed(ev)
    p.settle()
    assert p.status(lost) == "aborted"
    lc = p.timeline.lifecycle(lost)
    assert lc is not None and lc.aborted_ts is not None and lc.aborted_ts <= killed_at + 1.0
    after = [e.request_id for e in events if isinstance(e, RequestSpan) and e.start_ts >= restart_at]
    assert len(after) >= 10
    results = {rid: p.store.get(rid) for rid in after}
    assert all(r is not None and r.final for r in results.values()), {rid: r and r.final for rid, r in results.items()}
    assert not any(c.request_id == lost for r in results.values() if r is not None for c in r.culprits)
    before = [e.request_id for e in events if isinstance(e, RequestSpan) and e.end_ts <= killed_at]
    assert before and all((r := p.store.get(rid)) is not None and r.final for rid in before)


def _status_from_inferred(p: AttributionPipeline, rid: str) -> str:
    """`status()` as it was before it stopped forcing the step inference: from the refreshed lifecycle."""
    settled = p.settled_status(rid)
    if settled is not None:
        return settled
    lc = p.timeline.lifecycle(rid)
    if lc is None:
        return "unknown"
    return "aborted" if (lc.aborted_ts is not None and not lc.complete) or p._lost(lc) else "running"


def test_status_without_step_inference_answers_as_the_inferred_lifecycle(
        killed_then_restarted: tuple[list[Event], str, float, float]) -> None:
    """Across the crash and the restart, status() answers what the refreshed lifecycle says, for every request
    held, at every 25th event; and before any restart it infers no step (an API lookup must not)."""
    events, lost, _, restart_at = killed_then_restarted
    p = AttributionPipeline(PipelineConfig(partial_timeout_s=1e6))
    seen: set[str] = set()
    checked = aborted = lazy = before = 0
    for i, ev in enumerate(events):
        p.feed(ev)
        if i % 25:
            continue
        ids = [lc.request_id for lc in p.timeline._book.lifecycles()] + ["no-such-request"]
        if ev.ts < restart_at:
            before += 1
            work = p.timeline.inference_work()
            fast = [p.status(rid) for rid in ids]
            lazy += p.timeline.inference_work() == work
        else:
            fast = [p.status(rid) for rid in ids]
        slow = [_status_from_inferred(p, rid) for rid in ids]
        assert fast == slow, [(r, f, s) for r, f, s in zip(ids, fast, slow, strict=True) if f != s]
        checked += len(ids)
        aborted += fast.count("aborted")
        seen.update(rid for rid, st in zip(ids, fast, strict=True) if st == "aborted")
    assert checked > 500 and lazy == before >= 5
    assert lost in seen and aborted > 0
