"""Properties against a small engine that follows vLLM v1's scheduling rules (fake_engine.py)."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from attrib_agent.events import RequestSpan
from attrib_agent.timeline import EngineTimeline

from .fake_engine import FakeConfig, FakeRequest, FakeRun, run

SETTINGS = settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def scenarios(draw: st.DrawFn) -> tuple[FakeConfig, list[FakeRequest]]:
    bs = draw(st.sampled_from([4, 8, 16, 32]))
    num_blocks = draw(st.integers(8, 64))
    budget = draw(st.sampled_from([32, 64, 128, 256, 512]))
    cap = (num_blocks - 1) * bs
    spread = draw(st.sampled_from([0.05, 0.3, 1.0]))
    requests = []
    for i in range(draw(st.integers(1, 12))):
        prompt = draw(st.integers(1, max(1, cap * 3 // 4)))
        output = draw(st.integers(1, max(1, min(60, cap - prompt))))
        arrival = draw(st.floats(0.0, spread, allow_nan=False))
        requests.append(FakeRequest(f"r{i}", round(arrival, 4), prompt, output))
    return FakeConfig(budget=budget, block_size=bs, num_blocks=num_blocks), requests


def members(tl: EngineTimeline) -> list[tuple[tuple[str, str, int], ...]]:
    return [tuple((m.request_id, m.phase, m.tokens) for m in r.members) for r in tl.steps()]


def truth(fr: FakeRun) -> list[tuple[tuple[str, str, int], ...]]:
    return [s.members for s in fr.steps]


@SETTINGS
@given(scenarios())
def test_with_spans_the_inferred_steps_are_the_engines(scenario: tuple[FakeConfig, list[FakeRequest]]) -> None:
    """Members, tokens, KV blocks held, preemption victims: all exactly what the engine did."""
    fr = run(*scenario)
    tl = EngineTimeline()
    tl.feed_all(fr.events)
    assert members(tl) == truth(fr)
    assert [sorted(out.holdings) for _, out in tl.outcomes()] == [sorted(s.holdings) for s in fr.steps]
    assert [out.predicted_blocks for _, out in tl.outcomes()] == [s.used for s in fr.steps]
    assert sorted((p.request_id, p.preempted_iteration) for p in tl.preemptions()) == sorted(fr.preemptions)
    assert tl.membership_quality().exact_share == 1.0
    for lc in tl.lifecycles():
        assert lc.complete


@SETTINGS
@given(scenarios(), st.integers(1, 50))
def test_questions_asked_while_feeding_do_not_change_the_answer(scenario: tuple[FakeConfig, list[FakeRequest]],
                                                                every: int) -> None:
    fr = run(*scenario)
    batch = EngineTimeline()
    batch.feed_all(fr.events)
    live = EngineTimeline(checkpoint_every=8, max_steps=4096)
    for i, ev in enumerate(fr.events):
        live.feed(ev)
        if i % every == 0:
            live.steps()
    assert live.steps() == batch.steps()
    assert live.lifecycles() == batch.lifecycles()
    assert live.preemptions() == batch.preemptions()


@SETTINGS
@given(scenarios())
def test_without_spans_the_counts_are_still_explained(scenario: tuple[FakeConfig, list[FakeRequest]]) -> None:
    """Live, before any span lands: members are guessed from the counts; the totals still add up."""
    fr = run(*scenario)
    tl = EngineTimeline()
    tl.feed_all(e for e in fr.events if not isinstance(e, RequestSpan))
    records = tl.steps()
    assert len(records) == len(fr.steps)
    for rec in records:
        ids = [m.request_id for m in rec.members]
        assert len(ids) == len(set(ids))
        assert all(m.tokens > 0 and m.blocks >= 0 for m in rec.members)
    q = tl.membership_quality()
    assert 0.0 <= q.exact_share <= 1.0 and q.mean_error >= 0.0


@settings(max_examples=8, deadline=None)
@given(st.integers(0, 2**16))
def test_memory_stays_bounded_on_a_long_stream(seed: int) -> None:
    rng = random.Random(seed)
    t, requests = 0.0, []
    for i in range(200):
        t += rng.expovariate(40.0)
        requests.append(FakeRequest(f"r{i}", round(t, 4), rng.randint(1, 200), rng.randint(1, 40)))
    fr = run(FakeConfig(budget=256, block_size=16, num_blocks=48, span_delay_s=0.5), requests)
    tl = EngineTimeline(max_steps=64, max_requests=24, max_samples=8, checkpoint_every=8, keep_s=0.2)
    for ev in fr.events:
        tl.feed(ev)
        sizes = tl.sizes()
        assert sizes["steps"] <= 64 and sizes["requests"] <= 24 and sizes["samples"] <= 8
        assert sizes["departed"] <= 64 and sizes["checkpoints"] <= 64 // 8 + 1
