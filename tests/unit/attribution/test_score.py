"""Scoring against the committed counterfactual truth (real recordings kept by `lab truth --keep-recordings`)."""

import json
import statistics

import pytest

from attrib_agent.cli import main
from attrib_agent.lab.score import Score, engine_blame, format_scores, score_command

from . import truth_spread

# docs/attribution.md's goals
GOAL_TOP1, GOAL_WHALE_ERROR, GOAL_NULL_ALARMS = 0.95, 0.20, 0.05


def error_margin(engine: Score, truth_dir) -> float:
    """One standard error of the truth, carried into the median per-whale error: a whale's error |B - T| / T moves
    by about (B / T) x (SE_T / T) when the truth's reps move by one standard error (see truth_spread.py)."""
    totals = truth_spread.whale_totals(truth_spread.load(truth_dir))
    return statistics.median((1 + engine.whale_rel_errors[w]) * se / t for w, (t, se) in totals.items()
                             if w in engine.whale_rel_errors)  # a whale whose true share is 0 (a decoy) has none


def error_bound(today: float, margin: float) -> float:
    """The goal or today's figure plus the truth's margin, whichever is stricter; today's plus margin when the
    goal is not met yet (the lead tightens it as the attributor improves)."""
    return min(GOAL_WHALE_ERROR, today + margin) if today <= GOAL_WHALE_ERROR else today + margin


def test_score_runs_on_the_committed_truth(fixtures_dir, capsys):
    truth_dir = fixtures_dir / "truth" / "whale2"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))  # the numbers, visible with -s and in CI logs on failure
    for s in (engine, naive):
        assert s.top1_total >= 1
        assert set(s.whale_rel_errors) == {"w1", "w2"}
        assert s.null_total == 3 * 20  # 3 null reps x 20 shorts
    # The null result is a real outcome: with no whale, nobody is blamed for more than 50 ms. Today 0/60 (goal
    # <= 5 %); null runs involve no Shapley truth and replay is deterministic, so no margin is due.
    assert engine.null_false_alarm == 0.0


def test_whale2_scores_hold_todays_figures_within_the_truths_spread(fixtures_dir):
    """whale2 meets neither goal today (docs/attribution.md): top-1 4/5 (goal 95 %), median per-whale error 24 %
    (w1 11 %, w2 37 %; goal 20 %). Its truth knows each whale's summed share only to one standard error of 24 % (w1)
    and 20 % (w2) of it (std of 3 reps per condition), so the error bound is today's 24 % plus that margin (~0.27),
    and top-1 may lose the 2 of its 5 slowed shorts whose true top two whales are within 2 SE of each other."""
    truth_dir = fixtures_dir / "truth" / "whale2"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    assert engine.median_whale_error is not None and naive.median_whale_error is not None
    margin = error_margin(engine, truth_dir)
    assert 0.2 <= margin <= 0.35  # the truth's spread itself: if it changes, so must this test's reasoning
    assert engine.median_whale_error <= error_bound(0.24, margin)
    assert engine.median_whale_error < naive.median_whale_error
    ambiguous = truth_spread.ambiguous_top1(truth_spread.load(truth_dir))
    assert ambiguous == 2 and engine.top1_total == 5
    assert engine.top1_hits >= 4 - ambiguous and engine.top1_hits >= naive.top1_hits


def test_a_three_way_interaction_is_split_within_the_goal(fixtures_dir):
    """preempt truth: no pair of its three whales slows the shorts much, all three do. The whales' summed blame is
    within 0.6 % of their summed Shapley truth (median 0.4 %), far inside the 20 % goal. Re-recorded by truth11 with
    the mended capture (1 MiB log pipe): the first recording measured 19 % (37 % before the factual world was
    observed rather than re-simulated), because 32 of its 480 shorts waited 0.1-1.06 s before vLLM received them,
    behind vLLM's full 64 KiB log pipe, a delay counted as harm by the truth but invisible to the engine. Today's
    0.4 % plus the truth's margin (one standard error, 3.3 % of each whale's total from the spread of its 3 reps,
    ~3 % carried into the error) is the bound, stricter than the goal. Better than the naive overlap split, with no
    false alarm in null runs. Top-1 is not scored: the three whales are identical and on every one of the 11
    slowed shorts (17 in the first recording) the true top two are within two standard errors."""
    truth_dir = fixtures_dir / "truth" / "preempt"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    assert set(engine.whale_rel_errors) == {"w1", "w2", "w3"} and engine.top1_total == 11
    assert engine.median_whale_error is not None and naive.median_whale_error is not None
    margin = error_margin(engine, truth_dir)
    assert 0.02 <= margin <= 0.05  # the truth's spread itself: if it changes, so must this test's reasoning
    assert engine.median_whale_error <= error_bound(0.004, margin) < GOAL_WHALE_ERROR
    assert engine.median_whale_error < naive.median_whale_error
    assert truth_spread.ambiguous_top1(truth_spread.load(truth_dir)) == engine.top1_total
    assert engine.null_false_alarm == 0.0



def test_whale2_b4096_misses_are_a_send_race_the_truth_measured(fixtures_dir):
    """The held-out 4,096-budget truth (docs/attribution.md, "Tenth session (score12)"): per-whale error 34 % (w1
    37 %, w2 31 %), top-1 2/5, null 0/60. Not the budget: every whale run's budget is inferred as 4,096 and its
    chunks (4,096 + 1,904; 4,063 + 937 beside w1's decode and s002) are the engine's. Most of the error is s002,
    sent at w2's instant: the lab client's order of the two flips with the condition (w2 first in every w2 run,
    s002 first in every w1+w2 run), so the truth's "w2 alone" has s002 queued behind w2's 4,096 chunk (+239 ms)
    while the re-simulation of the observed world without w1 starts s002 alone on an idle engine before w2
    arrives (+0 ms), and splits s002's slowdown evenly. The truth knows each whale's total to 50 % (w1) and 25 %
    (w2) of it (one standard error) and 4 of its 5 slowed shorts' top two whales within two: the bound is today's
    34 % plus that margin (~0.51), and the engine stays better than the naive overlap split."""
    from attrib_agent.lab.score import replayed_timeline, spec_ids
    from attrib_agent.recording import Recording

    truth_dir = fixtures_dir / "truth" / "whale2-b4096"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    truth = truth_spread.load(truth_dir)
    first: dict[str, set[str]] = {}
    for run in (r for r in truth["runs"] if r["accepted"] and r["condition"] != "none"):
        tl = replayed_timeline(truth_dir / run["recording"])
        assert tl.token_budget() == 4096
        if "w2" in run["condition"]:
            spec = spec_ids(Recording(truth_dir / run["recording"]))
            arrival = {spec[lc.request_id]: lc.arrival_ts for lc in tl.lifecycles() if lc.request_id in spec}
            first.setdefault(run["condition"], set()).add(min(("w2", "s002"), key=lambda k: arrival[k]))
    assert first == {"w2": {"w2"}, "w1+w2": {"s002"}}  # the race, the same way in every rep
    assert engine.median_whale_error is not None and naive.median_whale_error is not None
    margin = error_margin(engine, truth_dir)
    assert 0.4 <= margin <= 0.6  # the truth's spread itself: if it changes, so must this test's reasoning
    assert engine.median_whale_error <= error_bound(0.34, margin)
    assert engine.median_whale_error < naive.median_whale_error
    assert truth_spread.ambiguous_top1(truth) == 4 and engine.top1_total == 5
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


def test_a_decoy_gets_none_of_the_whales_blame(fixtures_dir):
    """decoy truth: 20 shorts beside a real whale (6,000/16) and a decoy (32/1,500: long-running, cheap, no KV
    pressure). The truth gives the decoy nothing (its Shapley shares are noise around 0, negative in sum). The
    re-simulation explains ~20 % of what the whale did on that loaded machine (its prefill chunks ran ~5x slower than
    the cost model prices them); the rest, the shortfall between the observed and the simulated world, goes only to
    the players the counterfactual worlds show to matter (the decoy took 88 % of the whale's blame when it was split
    equally; now 0.2 %). The frontend offset is learnt from requests the steps show uncontended, so it no longer
    absorbs the queueing the step log saw: the whale's summed blame is within 9 % of its truth (66 % before, when the
    offset, 0.96 s, was learnt from every request's observed-minus-simulated TTFT)."""
    truth_dir = fixtures_dir / "truth" / "decoy"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    truth = truth_spread.load(truth_dir)
    assert set(truth["whales"]) == {"w1", "d1"} and engine.top1_total == 20
    totals = truth_spread.whale_totals(truth)
    assert totals["d1"][0] <= totals["d1"][1] < 0.1 * totals["w1"][0]  # the decoy's truth: within its noise of 0
    all_runs = [r for r in truth["runs"] if r["accepted"] and r["condition"] == truth["conditions"][-1]]
    blamed = {"w1": 0.0, "d1": 0.0}
    for run in all_runs:
        for spec, per in engine_blame(truth_dir / run["recording"]).items():
            for w in blamed if spec in truth["shorts"] else ():
                blamed[w] += per.get(w, 0.0) / len(all_runs)
    assert blamed["d1"] < 0.1 * blamed["w1"], blamed  # the goal; 0.2 % today
    assert engine.whale_rel_errors.keys() == {"w1"}  # the decoy's true total is 0: no relative error
    assert engine.median_whale_error is not None
    assert engine.median_whale_error <= GOAL_WHALE_ERROR  # 9 % today (66 % before); the truth's margin is ~8 %
    ambiguous = truth_spread.ambiguous_top1(truth)
    assert engine.top1_hits >= 20 - ambiguous and engine.top1_hits > naive.top1_hits  # 20/20 today
    assert engine.null_false_alarm == 0.0


@pytest.mark.parametrize(("recording", "before_s"), [("truth/decoy/runs/d1+w1-r0", 0.96),
                                                     ("recordings/preempt-steps", 5.56)])
def test_the_frontend_offset_does_not_swallow_the_waits_the_steps_saw(fixtures_dir, recording, before_s):
    """The TTFT offset (the frontend's own time, added to every baseline) was a low quantile of observed-minus-
    simulated TTFT over all requests; where the simulation under-predicts queueing (decoy: the whale's prefill ran
    ~5x slower than priced; preempt-steps: every request waited), it learnt the queueing as "frontend" (0.96 s and
    5.56 s) and the shorts' slowdowns read 0. Learnt from requests the steps show uncontended (else only the TTFT
    the steps do not account for), it is the frontend's few milliseconds."""
    from attrib_agent.attribution.attributor import Attributor
    from attrib_agent.lab.score import replayed_timeline

    attributor = Attributor()
    results = attributor.attribute(replayed_timeline(fixtures_dir / recording))
    offset = attributor.frontend_offsets()[0]
    assert offset < 0.05 < before_s
    slowed = [r for r in results if r.ttft_s is not None and r.ttft_s > 1.0 and not r.is_whale]
    assert slowed and all(r.ttft_slowdown_s > 0.5 * r.ttft_s for r in slowed)  # none reads "no interference"
