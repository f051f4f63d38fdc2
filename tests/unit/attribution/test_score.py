"""Scoring against the committed counterfactual truth (real recordings kept by `lab truth --keep-recordings`)."""

import json
import statistics
from typing import Any

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


def s002_beside_w2s_chunk(truth_dir) -> dict[str, tuple[float, Any, dict[str, float]]]:
    """For each all-whale run of a whale2 truth whose client measured s002 slowed 2x (against its no-whale mean):
    (its measured slowdown, the engine's result for it, the engine's TTFT blame on w1 and w2), seconds."""
    from attrib_agent.lab.score import attributed
    from attrib_agent.recording import CLIENT, Recording

    truth = truth_spread.load(truth_dir)
    alone = truth["shorts"]["s002"]["conditions"]["none"]["ttft_s"]["mean"]
    out: dict[str, tuple[float, Any, dict[str, float]]] = {}
    for run in (r for r in truth["runs"] if r["accepted"] and r["condition"] == "w1+w2"):
        path = truth_dir / run["recording"]
        client = next(c for c in Recording(path).records(CLIENT) if c["spec_id"] == "s002")
        measured = client["first_token_ts"] - client["actual_send_ts"]
        if measured < 2 * alone:
            continue
        results, _, spec = attributed(path)
        [r] = [r for r in results if spec.get(r.request_id) == "s002"]
        whales = {w: sum(c.ttft_s for c in r.culprits if spec.get(c.request_id) == w) for w in ("w1", "w2")}
        out[path.name] = (measured - alone, r, whales)
    return out


def assert_s002_goes_to_the_whales_in_its_step(missed: dict[str, tuple[float, Any, dict[str, float]]],
                                              slowed_by: float) -> None:
    """s002's wait beside w2's first chunk (the re-simulation runs it alone before w2 arrives, so no world shows a
    whale to matter) is explained by the observed steps: to the whales in them, by what each cost there, w2's chunk
    far more than w1's decode, and the result says so in its evidence (seen13; 1-6 ms blamed before, the rest
    unexplained)."""
    for slowdown, r, whales in missed.values():
        assert slowdown > slowed_by and r.unexplained_ttft_s <= 0.05 * r.ttft_slowdown_s
        assert sum(whales.values()) >= 0.9 * slowdown and whales["w2"] > 4 * whales["w1"] > 0
        assert r.evidence["prefill_contention"] == "observed_comembership"


def test_whale2_scores_hold_todays_figures(fixtures_dir):
    """whale2, re-recorded with the ordered client (truth13, docs/attribution.md "Eleventh session (truth13)") on a
    quiet host: w1's prefill (0.32-0.38 s) ends before s000 is sent and neither whale alone delays a short. With
    both, s002 (sent 3-5 ms before w2) missed the step then running on w1's decode, and vLLM took it in the next one
    with w2's first 2,015-token chunk, in every rep (15 -> 99 ms). The agent's re-simulation runs s002 alone in the
    step before w2 arrives, so no world without a whale changes its TTFT; the wait it misses goes to the whales in
    s002's observed steps by what each cost there (seen13): w2 65-84 ms, w1 10-17 ms (before: w1 1-3 ms, w2 0, the
    rest unexplained). Per-whale error w1 80 %, w2 19 % (median 49 %; was 97 % and 100 %): the truth splits the
    interaction about evenly (w1 0.068, w2 0.090 s), counting w1's part in s002 missing the step, which no observed
    step shows. The naive overlap split (44 %) is still below the median. Top-1 0/1 (w2 named on s002, whose true top
    two are within two standard errors; w1's 1-3 ms made it 1/1 before), null 0/60. The first recording (slow host,
    s002 and w2 in either order) measured 24 %, top-1 4/5. Replay is deterministic: the figures are pinned as
    measured."""
    truth_dir = fixtures_dir / "truth" / "whale2"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    assert engine.whale_rel_errors == pytest.approx({"w1": 0.796, "w2": 0.191}, abs=0.005)  # seen13; 0.966, 1.0
    assert naive.median_whale_error == pytest.approx(0.437, abs=0.005)
    assert naive.median_whale_error < engine.median_whale_error  # w1's share of the interaction (above)
    ambiguous = truth_spread.ambiguous_top1(truth_spread.load(truth_dir))
    assert ambiguous == 1 and (engine.top1_hits, engine.top1_total) == (0, 1)  # seen13; 1/1 before
    assert engine.null_false_alarm == 0.0
    missed = s002_beside_w2s_chunk(truth_dir)
    assert sorted(missed) == ["w1+w2-r0", "w1+w2-r1", "w1+w2-r2"]
    assert_s002_goes_to_the_whales_in_its_step(missed, 0.07)


def test_whale2_b4096_sends_s002_first_in_every_run_and_its_wait_beside_w2_goes_to_the_whales_there(fixtures_dir):
    """The held-out 4,096-budget truth, re-recorded with the ordered client (truth13). score12 found the first
    recording's s002 and w2 (sent at the same offset) reaching vLLM in an order that followed the condition (w2 first
    in every w2 run, s002 first in every w1+w2 run), so that truth compared two arrival orders (per-whale error 34 %).
    Now s002 is first in every run that has w2 (3-5 ms ahead: the client holds w2 for s002's response head), and
    every run's budget is 4,096, read from vLLM's start-up line, the null runs' too. Alone neither whale delays a
    short. With both, in r0 and r2 vLLM took s002 in the step with w2's first 4,063-token chunk (13 -> 205-211 ms;
    in r1 s002 ran in the step before, 13 ms). The agent gives that wait to the whales in s002's observed steps, as
    on whale2 (seen13: w2 179-191 ms, w1 12-16 ms; before, 189-200 ms unexplained): per-whale error w1 89 %, w2 23 %
    (was 96 % and 100 %; the naive overlap split 27 %), top-1 1/1 (was 0/1; s002: the truth's top two within two
    standard errors), null 0/60."""
    from attrib_agent.lab.score import replayed_timeline, spec_ids
    from attrib_agent.recording import Recording

    truth_dir = fixtures_dir / "truth" / "whale2-b4096"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    truth = truth_spread.load(truth_dir)
    first: dict[str, set[str]] = {}
    for run in (r for r in truth["runs"] if r["accepted"]):
        tl = replayed_timeline(truth_dir / run["recording"])
        assert tl.token_budget() == 4096
        if "w2" in run["condition"]:
            spec = spec_ids(Recording(truth_dir / run["recording"]))
            arrival = {spec[lc.request_id]: lc.arrival_ts for lc in tl.lifecycles() if lc.request_id in spec}
            first.setdefault(run["condition"], set()).add(min(("w2", "s002"), key=lambda k: arrival[k]))
    assert first == {"w2": {"s002"}, "w1+w2": {"s002"}}  # score12's race is gone: s002 first in every rep
    assert engine.whale_rel_errors == pytest.approx({"w1": 0.889, "w2": 0.233}, abs=0.005)  # seen13; 0.964, 1.0
    assert naive.median_whale_error == pytest.approx(0.270, abs=0.005)
    assert truth_spread.ambiguous_top1(truth) == 1 and (engine.top1_hits, engine.top1_total) == (1, 1)
    assert engine.null_false_alarm == 0.0
    missed = s002_beside_w2s_chunk(truth_dir)
    assert sorted(missed) == ["w1+w2-r0", "w1+w2-r2"]
    assert_s002_goes_to_the_whales_in_its_step(missed, 0.15)


def test_a_three_way_interaction_is_split_within_the_goal(fixtures_dir):
    """preempt truth: no pair of its three whales slows the shorts much, all three do. The whales' summed blame is
    within 0.6 % of their summed Shapley truth (median 0.4 %), far inside the 20 % goal. Re-recorded by truth11 with
    the mended capture (1 MiB log pipe): the first recording measured 19 % (37 % before the factual world was
    observed rather than re-simulated), because 32 of its 480 shorts waited 0.1-1.06 s before vLLM received them,
    behind vLLM's full 64 KiB log pipe, a delay counted as harm by the truth but invisible to the engine. Today's
    0.4 % plus the truth's margin (one standard error, 10 % of each whale's total from the spread of its 3 reps'
    sums over the shorts, which move together; 3.3 % with the shorts taken as independent) is the bound, stricter
    than the goal. Better than the naive overlap split, with no
    false alarm in null runs. Top-1 is not scored: the three whales are identical and on every one of the 11
    slowed shorts (17 in the first recording) the true top two are within two standard errors."""
    truth_dir = fixtures_dir / "truth" / "preempt"
    engine, naive = score_command(truth_dir)
    print(format_scores([engine, naive]))
    assert set(engine.whale_rel_errors) == {"w1", "w2", "w3"} and engine.top1_total == 11
    assert engine.median_whale_error is not None and naive.median_whale_error is not None
    margin = error_margin(engine, truth_dir)
    assert 0.08 <= margin <= 0.12  # the truth's spread itself: if it changes, so must this test's reasoning
    assert engine.median_whale_error <= error_bound(0.004, margin) < GOAL_WHALE_ERROR
    assert engine.median_whale_error < naive.median_whale_error
    assert truth_spread.ambiguous_top1(truth_spread.load(truth_dir)) == engine.top1_total
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
    # The decoy's truth: within its noise of 0 (one SE, 15.7 s from the runs' sums), the whale's 3.1 SE from it.
    assert totals["d1"][0] <= totals["d1"][1] < 0.35 * totals["w1"][0]
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
