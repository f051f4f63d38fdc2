"""The timeline against vLLM's own per-step facts on a committed recording made with the step plugin.

Goals from the scheduler-oracle issue: preempted requests named with precision and recall >= 90 %, and
step membership right on >= 99 % of steps; every step vLLM ran must be in the timeline.
"""

import pytest

from attrib_agent.lab.step_truth import score_recording
from attrib_agent.recording import VLLM_STEPS, Recording


@pytest.fixture(scope="module")
def rec_path(fixtures_dir):
    return fixtures_dir / "recordings" / "preempt-steps"


def test_the_recording_holds_every_step_with_vllms_ids(rec_path):
    rec = Recording(rec_path)
    assert rec.meta["truth_plugin"] is True
    steps = [m for m in rec.records(VLLM_STEPS) if m["kind"] == "step"]
    iters = [m["iter"] for m in steps if m["iter"] is not None]
    assert iters == list(range(iters[0], iters[0] + len(iters)))  # no step lost
    assert sum(len(m["preempted"]) for m in steps) == rec.meta["preemptions"] >= 1
    assert all(m["drops"] == 0 for m in steps)


def test_timeline_agrees_with_vllm_step_by_step(rec_path):
    s = score_recording(rec_path)
    assert s is not None and s.steps > 100
    assert s.steps_in_timeline == s.steps
    assert s.membership_share >= 0.99
    assert s.block_exact_share >= 0.95
    assert s.preemption_precision >= 0.9 and s.preemption_recall >= 0.9


def test_lab_score_prints_the_step_truth_of_a_recording(rec_path):
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-m", "attrib_agent", "lab", "score", str(rec_path)],
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert "per-step truth" in done.stdout and "preempt-steps" in done.stdout
