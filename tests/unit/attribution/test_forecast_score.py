"""The forecast against the committed counterfactual truths (`attrib-agent lab forecast-score`): today's figures held.
The forecast is deterministic, so the margins are for changes to the model, sized by the truth's own resolution: the
standard error of a whale's summed true harm (over the shorts, 3 reps per condition; since truthse17 from the spread of
the runs' sums, which counts the shorts of a run moving together) is 62 % of it for preempt/w2, 12 % for whale2/w2, 10 %
for preempt/w3, and 140 % and 500 % for whale2/w1 and preempt/w1, which are truly harmless (37 %, 10 %, 3 %, 97 % and
198 % with the shorts taken as independent) (preempt re-recorded with the mended capture, truth11; whale2 with the
ordered client on a quiet host, truth13; before: 30-37 % for whale2's two and preempt/w2)."""

from __future__ import annotations

import math
from functools import cache
from pathlib import Path

import pytest

from attrib_agent.lab.forecast_score import WhaleCase, format_report, score_dirs, spearman, summary

TRUTH = Path(__file__).resolve().parents[2] / "fixtures" / "truth"
SCORED = ("preempt", "whale2")  # the truths these figures were measured on; the decoy truth came later (not yet scored)


@cache
def cases() -> list[WhaleCase]:
    return score_dirs([TRUTH / name for name in SCORED])


def test_declared_load_figures_hold() -> None:
    s = summary(cases(), "declared")
    assert s["whales"] == 5
    # measured 36 %, whale2/w2's error (22 % until the gap between steps was measured, forecast_state.step_gap:
    # whale2/w2's own decode steps ran 0.7-0.8 ms apart, not the prior's 1.5 ms, and its forecast moved 0.83 ->
    # 0.93 s against 0.69 +/- 0.20 s, within 1.2 of the truth's standard errors). 34 % (preempt/w3's) before
    # truth11 re-recorded preempt: its single whales' true harms fell to 0.006 and 0.033 s (their shorts had
    # waited behind vLLM's full log pipe), so their errors (45x, 29x) sit above the median and it moved up one
    # whale; today's figure plus the truth's own median resolution (37 %) would allow 73 %. 57 % since fcast12:
    # s002, received before w2 in r0 and r1 but added after w2's `Received`, was missing from the state; now in
    # it, the forecast gives it 0.142 and 0.202 s (its TTFT was 0.139 and 0.199 s: it rode w2's first chunk), and
    # whale2/w2 moves 0.93 -> 1.08 s: what was already too much is the expected arrivals' (0.56-1.34 s).
    # truth13 re-recorded whale2 with the ordered client on a quiet host (its w1 prefill 0.32-0.38 s, was 0.66-1.23
    # s): w1 now harms nobody (0.010 +/- 0.010 s, truly harmless, forecast 0.40 s: +4,000 %) and w2 only s002, which
    # rides w2's first chunk when w1 keeps the engine busy (0.160 +/- 0.016 s, forecast 0.054 / 0.085 / 0.043 s:
    # -62 %). With two of the five whales truly harmless the median is preempt/w2's +2,884 %; the resolved median
    # (3 whales) is whale2/w2's 62 %.
    # 28.84 until decl15: preempt/w2's r0 state is read after w1 reached an idle engine, whose first chunk was
    # then under way (`forecast_sim.busy_since`): its forecast 0.99 -> 0.98 s
    assert math.isclose(s["median_rel_error"], 28.43, abs_tol=0.01)  # truth13; 0.57 on whale2's first recording
    # truthse17: the SE from the runs' sums (shorts of a run move together) leaves preempt/w2 unresolved (net 0.023
    # +/- 0.021 s): the median of preempt/w3's 27 % and whale2/w2's 62 %
    assert math.isclose(s["median_rel_error_resolved"], 0.45, abs_tol=0.01)  # truthse17; 0.62 (truth13)
    by = {f"{c.truth}/{c.whale}": c for c in cases()}
    assert by["whale2/w2"].forecast_s["declared"][:2] == pytest.approx([0.054, 0.085], abs=0.005)  # 0.701, 1.540
    # measured 0.40 (5 whales: steps of 0.1): whale2/w2, second by true harm, is forecast last; 0.70 before truth13
    assert math.isclose(s["rank_correlation"], 0.4, abs_tol=0.01)
    assert s["called_harmless_but_2x"] == []  # every whale with a short slowed >= 2x is forecast harmful


def test_learnt_load_calls_no_whale_harmless_even_before_any_load_was_seen() -> None:
    s = summary(cases(), "learnt")
    # preempt/w1, w2 and whale2/w1 come before two arrivals were seen: no rate to expect anyone after them. They
    # were called harmless (nobody expected) until the probe: the next arrival waits behind the whale's prefill
    assert s["called_harmless_but_2x"] == []
    by = {f"{c.truth}/{c.whale}": c for c in cases()}
    for k in ("preempt/w1", "preempt/w2", "whale2/w1"):
        assert min(by[k].forecast_s["learnt"]) >= 0.05 and not any(by[k].harmless["learnt"]), k
    assert by["whale2/w2"].mean("learnt") > 0.5 * by["whale2/w2"].true_harm_s  # with shorts seen, it sees harm


def test_the_big_whale_is_ranked_first_and_the_report_prints_every_whale() -> None:
    by = {f"{c.truth}/{c.whale}": c for c in cases()}
    top = max(by, key=lambda k: by[k].mean("declared") or 0.0)
    assert top == "preempt/w3" == max(by, key=lambda k: by[k].true_harm_s)  # the preempting third whale
    text = format_report(cases())
    assert all(k in text for k in by) and "median |error|" in text


def test_the_median_over_resolved_truths_leaves_out_harms_the_truth_cannot_tell_from_none() -> None:
    """A true harm is resolved when its net (unclipped) sum is at least two of its standard errors from zero
    (`score.is_resolved`, `lab score`'s rule), the standard error from the spread of the runs' sums over the same
    shorts (the shorts of one run move together; truthse17): preempt/w1 (net -0.031 +/- 0.029 s) is not; a relative
    error against it scores the truth's run-to-run noise as much as the forecast. preempt/w2 (net 0.023 +/- 0.021 s,
    clipped 0.033: s000, sent 0.25 s after it, waits behind w1's and w2's prefills, 8.6 -> 30.4 ms, the rest is
    noise) is not either since truthse17 (0.033 +/- 0.012 s with the shorts independent and clipped: resolved); its
    s000 2x still is (`true_resolved_2x`)."""
    by = {f"{c.truth}/{c.whale}": c for c in cases()}
    assert by["preempt/w3"].true_se_s == pytest.approx(1.06, abs=0.01) and by["preempt/w3"].resolved  # 0.34 indep.
    assert by["preempt/w2"].true_se_s == pytest.approx(0.021, abs=0.001) and not by["preempt/w2"].resolved  # 0.012
    assert by["preempt/w2"].true_net_s == pytest.approx(0.023, abs=0.001) and by["preempt/w2"].true_resolved_2x
    # whale2 re-recorded (truth13): w1 -0.008 +/- 0.014 s net is not resolved (0.52 +/- 0.19 s before), w2 is
    # (0.160 +/- 0.019 s; 0.016 with the shorts independent)
    assert not by["preempt/w1"].resolved and not by["whale2/w1"].resolved and by["whale2/w2"].resolved
    assert by["whale2/w2"].true_se_s == pytest.approx(0.019, abs=0.001)
    s = summary(cases(), "declared")
    resolved = sorted(abs(c.mean("declared") - c.true_harm_s) / c.true_harm_s  # type: ignore[operator]
                      for c in cases() if c.resolved)
    assert s["resolved_whales"] == 2 and s["median_rel_error_resolved"] == pytest.approx(sum(resolved) / 2)
    assert "whose truth is resolved" in format_report(cases())


def test_a_2x_is_resolved_only_when_that_shorts_difference_is_and_specificity_counts_the_truly_harmless() -> None:
    """preempt/w3 slows shorts 2x far past their noise, and so does w2 (s000 3.5x, 2.8 standard errors). preempt/w1
    slows no short 2x and its harm is unresolved: truly harmless. (Before truth11 re-recorded preempt with the mended
    capture, w1's 2x was two shorts' single-rep stalls of 1.0 and 1.5 standard errors, waits behind vLLM's full log
    pipe: slowed 2x, not resolved; the synthetic `stall` below keeps that case.) Specificity: a whale with no short 2x
    and an unresolved harm is truly harmless, and counts as called harmless only when every recording's verdict
    says so."""
    by = {f"{c.truth}/{c.whale}": c for c in cases()}
    assert not by["preempt/w1"].true_slowed_2x and by["preempt/w1"].truly_harmless
    assert by["preempt/w2"].true_resolved_2x and not by["preempt/w2"].truly_harmless
    assert by["preempt/w3"].true_resolved_2x and not by["preempt/w3"].truly_harmless
    # whale2 re-recorded (truth13): w1 slows no short 2x (truly harmless), w2 beside w1 slows s002 (15 -> 99 ms, mean
    # of 3 reps)
    assert by["whale2/w1"].truly_harmless and by["whale2/w2"].true_resolved_2x
    quiet = WhaleCase("t", "q", (), 0.01, False, true_se_s=0.02, true_net_s=0.01)  # no short 2x, within its noise
    stall = WhaleCase("t", "s", (), 0.3, True, true_se_s=0.2, true_net_s=0.3)  # 2x, but not resolved
    sure = WhaleCase("t", "w", (), 5.0, True, True, true_se_s=0.5, true_net_s=5.0)  # 2x, resolved
    for c, verdicts in ((quiet, [True, True]), (stall, [True, False]), (sure, [False, True])):
        c.forecast_s["declared"], c.harmless["declared"] = [0.01, 0.02], verdicts
    s = summary([quiet, stall, sure], "declared")
    assert s["called_harmless_but_2x"] == ["t/s", "t/w"] and s["called_harmless_but_resolved_2x"] == ["t/w"]
    assert s["truly_harmless"] == ["t/q"] and s["truly_harmless_called_harmless"] == ["t/q"]
    quiet.harmless["declared"] = [True, False]  # harmful in one recording: not called harmless
    assert summary([quiet], "declared")["truly_harmless_called_harmless"] == []


def test_spearman() -> None:
    assert spearman([1, 2, 3], [10, 20, 30]) == 1.0
    assert spearman([1, 2, 3], [3, 2, 1]) == -1.0
    assert spearman([1, 2], [1, 2]) is None and spearman([1, 1, 1], [1, 2, 3]) is None
    assert math.isclose(spearman([1, 2, 2, 3], [1, 2, 3, 4]) or 0, 0.9486832980505138)


def test_every_committed_truth_has_its_whales_and_a_declared_load() -> None:
    """The report runs on `tests/fixtures/truth/*`: RAG shorts and mixed short streams (continuous traffic) too;
    a mixed stream is declared as its sizes in turn (its median sizes the single figure), RAG shorts with their
    shared prefix."""
    import json

    from attrib_agent.lab.forecast_score import declared_load, whale_cases

    dirs = sorted(p for p in TRUTH.iterdir() if (p / "truth.json").is_file())
    assert {"continuous", "prefix", "preempt-midstream"} <= {d.name for d in dirs}
    for d in dirs:
        truth, found = whale_cases(d)
        assert found and all(c.truth == d.name for c in found)
        for c in found:
            got = declared_load(truth, truth["whales"][c.whale]["offset_s"])
            assert got is not None and got[0].rate_per_s > 0 and got[1] > 0
    continuous = json.loads((TRUTH / "continuous" / "truth.json").read_text())
    got = declared_load(continuous, 15.0)
    assert got is not None and (got[0].prompt_tokens, got[0].max_tokens) == (32, 32)  # siso is the median
    later = sorted((e for e in continuous["shorts"].values() if e["offset_s"] > 15.0), key=lambda e: e["offset_s"])
    assert len(got[0].mix) == len(later) and got[0].size(0)[0] == (32 if later[0]["class"][0] == "s" else 1024)
    assert {p for p, _ in got[0].mix} == {32, 1024}  # short and long inputs, in the stream's order
    prefix = json.loads((TRUTH / "prefix" / "truth.json").read_text())
    got = declared_load(prefix, 9.0)
    assert got is not None and got[0].prompt_tokens == 1856 and got[0].mix == ()
    assert got[0].cached_prefix_tokens == 1792  # system prompt and document, shared by the stream


def test_the_self_fitted_cost_prices_the_decoy_whales_chunks_from_its_own_steps() -> None:
    """The diagnostic's cost model: fitted on the whole recording, it keeps the whale's long chunks past the
    ~1,500 decode steps after them (the fit window alone forgot them and priced a chunk at 0.19-0.38 s)."""
    from attrib_agent.attribution.cost_model import StepFeatures
    from attrib_agent.lab.forecast_score import self_fitted_cost
    from attrib_agent.pipeline import AttributionPipeline
    from attrib_agent.sources.replay import ReplaySource

    rec = TRUTH / "decoy" / "runs" / "d1+w1-r0"
    cost = self_fitted_cost(rec)
    p = AttributionPipeline()
    p.feed_all(list(ReplaySource(rec).events()))
    chunks = [(StepFeatures.from_record(o.record), o.record.elapsed_s) for _, o in p.timeline.outcomes()]
    chunks = [(f, y) for f, y in chunks if f.prefill_tokens >= 2000]
    assert len(chunks) == 3
    for f, took in chunks:
        priced = cost.step_seconds_with_prefill(f.prefill_tokens, f.decode_requests, f.decode_context_sum,
                                                f.prefill_pairs) - cost.coefficients.step_gap_s
        assert math.isclose(priced, took, rel_tol=0.25)


def test_the_true_harm_counts_only_shorts_the_whale_could_have_delayed() -> None:
    """continuous/w2 is sent at 27 s; 23 shorts had their first token before then in every rep. The truth's
    with/without difference for them is the two conditions' run-to-run noise (w2's world against w1's, both
    before w2 exists), and max(., 0) made 1.43 s of harm of it: 86 % of the 1.66 s the score compared the
    forecast with, which cannot reach back. What remains is the harm to shorts still waiting or sent later."""
    from attrib_agent.lab.forecast_score import whale_cases

    _, found = whale_cases(TRUTH / "continuous")
    by = {c.whale: c for c in found}
    w1, w2 = by["w1"], by["w2"]
    assert w2.done_before == 23 and math.isclose(w2.done_before_s, 1.43, abs_tol=0.01)
    assert math.isclose(w2.true_harm_s, 0.23, abs_tol=0.01) and not w2.true_slowed_2x  # was 1.66 s, 2x
    assert w1.done_before == 12 and math.isclose(w1.true_harm_s, 11.25, abs_tol=0.01)  # c012, in flight, counts
    _, early = whale_cases(TRUTH / "preempt")  # whales sent before any short: nothing left out
    assert all(c.done_before == 0 for c in early)
