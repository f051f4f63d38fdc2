"""Scoring against the committed counterfactual truth (real recordings kept by `lab truth --keep-recordings`)."""

import json

from attrib_agent.cli import main
from attrib_agent.lab.score import Score, format_scores, score_command


def test_score_runs_on_the_committed_truth(fixtures_dir, capsys):
    truth_dir = fixtures_dir / "truth" / "whale2"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))  # the numbers, visible with -s and in CI logs on failure
    for s in (engine, naive):
        assert s.top1_total >= 1 and 0 <= (s.top1 or 0) <= 1
        assert set(s.whale_rel_errors) == {"w1", "w2"}
        assert s.null_total == 3 * 20  # 3 null reps x 20 shorts
    # The null result is a real outcome: with no whale, nobody is blamed for more than 50 ms.
    assert engine.null_false_alarm is not None and engine.null_false_alarm <= 0.05


def test_a_three_way_interaction_is_split_within_the_goal(fixtures_dir):
    """preempt truth: no pair of its three whales slows the shorts, all three do. The whales' summed blame is
    within 25% of their summed Shapley truth (measured 19%, the goal 20%; 37% before the factual world was
    observed rather than re-simulated), better than the naive overlap split, with no false alarm in null runs."""
    engine, naive = score_command(fixtures_dir / "truth" / "preempt")
    print(format_scores([engine, naive]))
    assert set(engine.whale_rel_errors) == {"w1", "w2", "w3"} and engine.top1_total >= 10
    assert engine.median_whale_error is not None and naive.median_whale_error is not None
    assert engine.median_whale_error <= 0.25 and engine.median_whale_error < naive.median_whale_error
    assert engine.null_false_alarm == 0.0


def test_score_cli_json(fixtures_dir, capsys):
    assert main(["lab", "score", str(fixtures_dir / "truth" / "whale2"), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert [o["name"].split(" [")[0] for o in out["counterfactual"]] == ["attrib-agent", "naive overlap"]
    assert out["step_truth"] == {}  # its recordings were made without the step plugin


def test_score_properties():
    s = Score("x", top1_hits=3, top1_total=4, whale_rel_errors={"a": 0.1, "b": 0.3, "c": 0.2}, null_flagged=1,
              null_total=20)
    assert s.top1 == 0.75 and s.median_whale_error == 0.2 and s.null_false_alarm == 0.05
    assert Score("empty").top1 is None
