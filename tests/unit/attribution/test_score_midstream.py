"""preempt-midstream truth: two 5,600/400 whales fill the KV while 12 shorts (32/256) decode, so vLLM preempts
shorts after their first tokens (each run with both whales: 7 preemptions, all of shorts already streaming); either
whale alone leaves the pool half free. 3 reps of each of the 4 conditions. Recorded with the step plugin, so
vLLM's own account says who was preempted.
Goals (issue 12): preempted shorts named `preemption` with precision and recall >= 90 %; per-whale error <= 20 %."""

import pytest

from attrib_agent.lab import cause_truth
from attrib_agent.lab.score import format_scores, score_command
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.vllm_ids import external_id

from . import truth_spread

GOAL_WHALE_ERROR = 0.20


@pytest.fixture(scope="module")
def truth_dir(fixtures_dir):
    return fixtures_dir / "truth" / "preempt-midstream"


@pytest.fixture(scope="module")
def crowded(truth_dir):
    truth = truth_spread.load(truth_dir)
    return [truth_dir / r["recording"] for r in truth["runs"]
            if r["accepted"] and r["condition"] == truth["conditions"][-1]]


def test_the_truth_has_shorts_preempted_mid_stream(truth_dir, crowded):
    truth = truth_spread.load(truth_dir)
    assert truth["conditions"] == ["none", "w1", "w2", "w1+w2"] and len(crowded) >= 3
    for path in crowded:
        decoding: set[str] = set()
        mid_stream = []
        for m in Recording(path).records(VLLM_STEPS):
            if m.get("kind") != "step":
                continue
            mid_stream += [external_id(r) for r in m["preempted"] if external_id(r) in decoding]
            decoding |= {external_id(s["id"]) for s in m["scheduled"] if s["new"] == 1}
        assert len(mid_stream) >= 3, path.name  # vLLM preempted requests that were already streaming tokens
        assert all("-s0" in rid for rid in mid_stream)  # ... and they were shorts


def test_preempted_shorts_are_named_preemption(crowded):
    """Every request vLLM preempted is named `preemption` (its result's `preempted_s`, or the cause on its
    culprits' seconds), and no other: 18 of 18 over the three runs. On main the ITL causes named it already; what
    is new is the score (`lab score`) and the queue-wait rule the causes below check."""
    c = cause_truth.score_dir(crowded)
    assert c is not None and c.preempted_true >= 9
    assert c.precision >= 0.9 and c.recall >= 0.9, c.as_dict()
    # causes against the plugin's labels in these runs: 95 % of blamed seconds, 97 % by each culprit's main cause
    # (goal 90 %; over all 12 runs, as `lab score` prints: 96 % and 97 %). 84 % / 87 % here while the truth gave
    # every co-member of a step the whole step (lab/step_marginals.py); 77 % / 86 % before the queue's head after a
    # multi-victim preemption was vLLM's last victim, needing the blocks for what it held
    assert c.share is not None and c.share >= 0.94 and c.dominant_share is not None and c.dominant_share >= 0.96


def test_the_whales_blame_is_within_the_goal(truth_dir):
    """TTFT: the whales' summed blame within 3 % of their summed Shapley truth (w1 1.4 %, w2 5.3 %; goal 20 %). The
    shorts' ITL, where the mid-stream stalls show, is scored too and misses the goal: 44 % (w1 67 %, w2 21 %): the
    agent splits it evenly (112 ms each) where the truth gives w2 twice w1's share (143 and 67 ms;
    docs/attribution.md); bounded at today's figure plus a few points, so a regression fails. Top-1 is not scored:
    on all 12 slowed shorts the two whales' true shares are within two standard errors of each other."""
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    assert set(engine.whale_rel_errors) == {"w1", "w2"}
    assert engine.median_whale_error is not None and engine.median_whale_error <= GOAL_WHALE_ERROR
    assert naive.median_whale_error is not None and engine.median_whale_error < naive.median_whale_error
    assert engine.null_false_alarm == 0.0
    assert engine.median_itl_whale_error is not None and engine.median_itl_whale_error <= 0.50
