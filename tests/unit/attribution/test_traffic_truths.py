"""Scores on the counterfactual truths of real traffic (issue 11, item 5): shared-prefix traffic (`prefix`: RAG
prompts whose prefix-cache hits are ~85 % of prompt tokens, beside a whale 3x their prompts) and continuous Poisson
traffic of seed 002's four shapes with whales mid-stream (`continuous`). docs/attribution.md holds the figures."""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from attrib_agent.lab.score import NULL_BLAME_S, Score, engine_blame, format_scores, score_command

from . import truth_spread
from .test_score import GOAL_NULL_ALARMS, GOAL_TOP1, error_bound, error_margin


def blame_split(truth_dir: Path, condition: str) -> tuple[float, float]:
    """Seconds of the shorts' TTFT blamed on whales and on the crowd (other shorts), per run of `condition`."""
    truth = json.loads((truth_dir / "truth.json").read_text())
    on: dict[bool, float] = defaultdict(float)
    runs = [r for r in truth["runs"] if r.get("accepted") and r["condition"] == condition]
    for run in runs:
        for spec, per in engine_blame(truth_dir / run["recording"]).items():
            if spec not in truth["whales"]:
                for culprit, s in per.items():
                    on[culprit in truth["whales"]] += s
    return on[True] / len(runs), on[False] / len(runs)


def null_alarms(truth_dir: Path) -> list[tuple[str, str, str]]:
    """(run, short, top culprit) of each short in a no-whale run blamed over NULL_BLAME_S on one culprit."""
    truth = json.loads((truth_dir / "truth.json").read_text())
    out = []
    for run in truth["runs"]:
        if run.get("accepted") and run.get("recording") and run["condition"] == "none":
            for spec, per in engine_blame(truth_dir / run["recording"]).items():
                top = max(per.items(), key=lambda kv: kv[1], default=None)
                if spec in truth["shorts"] and top is not None and top[1] > NULL_BLAME_S:
                    out.append((run["recording"], spec, top[0]))
    return out


def scores(truth_dir: Path) -> tuple[Score, Score]:
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    return engine, naive


def test_shared_prefix_truth_meets_the_goals(fixtures_dir: Path) -> None:
    """`prefix`: 40 RAG shorts (256-token system prompt + one of 3 1,536-token documents + 64 own tokens, 32 out)
    beside a 5,568/64 whale; 2 conditions x 3 reps. Measured: the whale's blame within 4 % of its true total (39.9 s,
    one standard error 13 % of it), the top culprit right on 19 of 19 slowed shorts, 3 of 120 null requests blamed
    over 50 ms, the crowd (the prefix groups' leaders included) 1.8 s of 40 s blamed with the whale present. Before
    the leaders left the whale rule (main at 4af740d): 7 %, 18 of 19, crowd 3.1 s."""
    truth_dir = fixtures_dir / "truth" / "prefix"
    engine, naive = scores(truth_dir)
    assert engine.top1_total >= 15 and set(engine.whale_rel_errors) == {"w1"}
    assert engine.median_whale_error is not None and naive.median_whale_error is not None
    margin = error_margin(engine, truth_dir)
    assert 0.4 <= margin <= 0.6  # the truth's own spread (the runs' sums; 0.14 shorts independent): if it changes,
    # so must this test's reasoning
    assert engine.median_whale_error <= error_bound(0.04, margin)
    assert engine.median_whale_error < naive.median_whale_error
    assert engine.top1 is not None and engine.top1 >= GOAL_TOP1  # one whale: is it named first, before the crowd
    assert engine.null_false_alarm is not None and engine.null_false_alarm <= GOAL_NULL_ALARMS
    on_whale, on_crowd = blame_split(truth_dir, "w1")
    assert on_crowd <= 0.1 * on_whale, (on_whale, on_crowd)


def test_continuous_truth_holds_todays_figures_within_the_truths_spread(fixtures_dir: Path) -> None:
    """`continuous`: 40 Poisson requests of seed 002's shapes at 1 req/s (~47 s, never idle) beside a 3,900/300 whale
    at 15 s and a 2,500/300 one at 27 s; 4 conditions x 3 reps while the machine's load average was 11-16. The
    goals are missed (docs/attribution.md): the whales' effect is small beside the truth's own noise. w1's true total
    is 7.2 s with one standard error of 3.0 s (41 %, from the runs' sums; 1.3 s with the shorts taken as independent),
    w2's 1.6 s with 3.0 s (noise), and 3 of the 6 shorts
    slowed >= 2x have their true top two within two standard errors. Measured: w1 43 %, w2 99 % (blamed ~0),
    median 71 % (naive 88 %); top-1 4 of 6 (naive 3); null false alarms 2 of 120 (naive 36), before `lab
    score` replayed whole recordings (nu17; since: w1 1 %, median 50 %, top-1 5 of 6, null false alarms 11 of
    120); the crowd 0.02 s per run beside the whales' 4.1 s. Bounds: today's figures plus the truth's margin, better
    than naive."""
    truth_dir = fixtures_dir / "truth" / "continuous"
    engine, naive = scores(truth_dir)
    assert set(engine.whale_rel_errors) == {"w1", "w2"} and engine.top1_total == 6
    assert engine.median_whale_error is not None and naive.median_whale_error is not None
    w1_t, w1_se = truth_spread.whale_totals(truth_spread.load(truth_dir))["w1"]
    assert 0.35 <= w1_se / w1_t <= 0.45  # the truth's own spread (the runs' sums; 0.18 shorts independent): if it
    # changes, so must this test's reasoning
    assert engine.whale_rel_errors["w1"] <= 0.43 + (1 + 0.43) * w1_se / w1_t
    assert engine.median_whale_error < naive.median_whale_error
    ambiguous = truth_spread.ambiguous_top1(truth_spread.load(truth_dir))
    assert ambiguous == 3 and engine.top1_hits >= max(4 - ambiguous, naive.top1_hits)
    # Null false alarms: 11 of 120 since `lab score` replays the whole recording (nu17: its 30 s window had kept only
    # the last 27-29 requests, 2 of 120). Every one names c000, the stream's first request (a lilo: 1,024 tokens in,
    # 256 out, at 3.1 s), whose prefill and decode run beside the next shorts, in every condition, so no condition
    # of the truth measures it: by the whale rule (8x the median footprint) it is a whale of the null runs. Beside it
    # the goal holds.
    assert engine.null_flagged == 11 and engine.null_total == 120
    alarms = null_alarms(truth_dir)
    assert len(alarms) == 11 and {culprit for _, _, culprit in alarms} == {"c000"}, alarms
    on_whales, on_crowd = blame_split(truth_dir, "w1+w2")
    assert on_whales > 0.3 * w1_t and on_crowd <= 0.1 * on_whales, (on_whales, on_crowd)
