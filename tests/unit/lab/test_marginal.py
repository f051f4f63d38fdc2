"""`lab marginal`: what a co-member adds to the same decodes' step time, read from vLLM's own step lines."""

import pytest

from attrib_agent.lab import marginal
from attrib_agent.lab.marginal import Step
from attrib_agent.lab.workload import get_scenario


def _steps(spec):
    """(ctx requests, ctx tokens, gen requests, elapsed ms, count) runs -> steps, 1 ms of period on top."""
    out = []
    for ctx_r, ctx_t, gen, ms, n in spec:
        for _ in range(n):
            out.append(Step(len(out), ctx_r, ctx_t, gen, ms, ms + 1.0))
    return out


def test_each_episode_is_timed_against_the_base_steps_around_it():
    """Base decodes slow down as their context grows (10 -> 12 ms); a burst of 4 more decoders between them adds
    2 ms over the base around it (11 ms), i.e. 0.5 ms a decoder; one 1,024-token chunk adds 40 ms. The burst's
    arrival step (its own prefill, 4 context requests) and its first and last decode steps are not timed."""
    steps = _steps([(0, 0, 2, 10.0, 20), (4, 128, 2, 30.0, 1), (0, 0, 6, 14.0, 1), (0, 0, 6, 13.0, 10),
                    (0, 0, 6, 20.0, 1), (0, 0, 2, 12.0, 20), (1, 1024, 2, 52.0, 1), (0, 0, 2, 12.0, 20)])
    eps = marginal.episodes(steps, base=2)
    assert [(e.kind, e.size, e.steps) for e in eps] == [("decode", 4, 10), ("prefill", 1024, 1)]
    assert eps[0].elapsed_delta_ms == pytest.approx(2.0) and eps[0].period_delta_ms == pytest.approx(2.0)
    assert eps[1].elapsed_delta_ms == pytest.approx(40.0)
    s = marginal.summary(eps)
    assert s["decode"][4]["elapsed_delta_ms"]["per_request_mean"] == pytest.approx(0.5)
    assert s["prefill"][1024]["episodes"] == 1


def test_a_run_of_steps_without_base_steps_around_it_is_not_timed():
    assert marginal.episodes(_steps([(0, 0, 6, 13.0, 10)]), base=2) == []


def test_the_scenario_holds_bursts_and_chunks_beside_two_long_decodes():
    s = get_scenario("marginal")
    base = [r for r in s.requests if r.spec_id.startswith("b")]
    assert len(base) == 2 and all(r.klass.output_tokens >= 2000 for r in base)
    last = max(r.offset_s for r in s.requests)
    assert last + 2 < 0.013 * 2000  # everything arrives while the base decodes still run (>= 13 ms a step)
    chunks = sorted(r.klass.prompt_tokens for r in s.requests if r.klass.name.startswith("pre"))
    assert chunks == [256, 256, 1024, 1024, 2000, 2000]
