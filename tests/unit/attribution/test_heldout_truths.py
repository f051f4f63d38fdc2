"""The held-out truths (whale1, mixed, kvpair; ninth session): scenarios the lab defined but no fit, constant or
pace rule was ever tuned on until price11 (its prior shape was chosen by its chunk prices on all nine truths,
these included: docs/forecast.md, "Tenth session"). What they show, as measured (docs/attribution.md and
docs/forecast.md, "Ninth session: held-out truths"); a change that moves a figure here updates those sections.

Attribution holds on them where the truth resolves a harm; the forecast did not: the step-cost fit an agent kept
from a run with no long prompt priced a whale's prefill from the prior (whale1: 2.8x its real chunks) or from
1,024-token chunks (mixed: half of them), and mixed/w1 was called harmless in one recording though it makes a
short wait 5x, far past the truth's noise. Since price11 such a fit prices the prefill by the prior's shape at
its measured pace (whale1 r0: 1.2x, mixed r0: 0.9x)."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest

from attrib_agent.attribution.forecast import Candidate, ForecastConfig
from attrib_agent.lab.forecast_score import WhaleCase, forecast_at_arrival, persisted_states, score_dirs, summary
from attrib_agent.lab.score import attributed, engine_blame, engine_itl_blame, score_truth
from attrib_agent.recording import LOG, Recording

from . import truth_spread

TRUTH = Path(__file__).resolve().parents[2] / "fixtures" / "truth"
HELD_OUT = ("whale1", "mixed", "kvpair")


@cache
def kept() -> list[WhaleCase]:
    return score_dirs([TRUTH / name for name in HELD_OUT], persisted=True)


def test_whale1_prefill_contention_is_attributed_within_the_truths_resolution() -> None:
    """One whale, two shorts delayed by its four chunks (0.35 and 0.11 s of Shapley share): blamed 0.467 s of the
    true 0.478 (2.2 %; the truth's standard error is 3 % of it), top-1 2/2, nobody blamed in the 60 null shorts."""
    s = score_truth(TRUTH / "whale1", "attrib-agent", engine_blame, engine_itl_blame)
    (total, se), = truth_spread.whale_totals(truth_spread.load(TRUTH / "whale1")).values()
    assert (s.top1_hits, s.top1_total) == (2, 2) and (s.null_flagged, s.null_total) == (0, 60)
    assert s.whale_rel_errors["w1"] <= 0.022 + 2 * se / total  # measured 2.2 %; 2 standard errors of the truth


def test_on_the_shorts_the_truth_resolves_the_mixed_whales_blame_matches_their_shapley_share() -> None:
    """mixed's per-whale error (w1 47 %, w2 100 %) is the truth's noise: w2's true share is 8 ms of clipped
    run-to-run spread, and w1's 0.18 s holds 0.06 s from shorts whose share is within 2 of its standard errors
    (m013, m014, m023: sent 3.6-7 s after w1's last token). On the shorts whose share is resolved (m002-m004, sent
    0.10-0.16 s after w1, waiting behind its 2 chunks), the engine blames 95 ms of the true 102 ms, all of it
    `prefill_contention`; w2 gets no blame."""
    truth = truth_spread.load(TRUTH / "mixed")
    runs = [r for r in truth["runs"] if r["accepted"] and r["condition"] == "w1+w2"]
    blame: dict[str, float] = {}
    for r in runs:
        for victim, per in engine_blame(TRUTH / "mixed" / r["recording"]).items():
            assert per.get("w2", 0.0) == 0.0, victim
            blame[victim] = blame.get(victim, 0.0) + per.get("w1", 0.0) / len(runs)
    resolved = {spec: e["shapley"]["ttft_s"]["w1"] for spec, e in truth["shorts"].items()
                if e["shapley"]["ttft_s"]["w1"] >= 2 * truth_spread.short_shapley_se(truth, spec)["w1"]}
    assert set(resolved) == {"m002", "m003", "m004"}
    true_s, blamed_s = sum(resolved.values()), sum(blame.get(s, 0.0) for s in resolved)
    assert math.isclose(true_s, 0.102, abs_tol=0.002) and abs(blamed_s - true_s) <= 0.1 * true_s  # 95 ms: -7 %
    results, _, spec = attributed(TRUTH / "mixed" / runs[0]["recording"])
    causes = {k for r in results if spec.get(r.request_id) in resolved for c in r.culprits for k, v in c.causes.items()
              if v > 0.001}
    assert causes == {"prefill_contention"}


def test_kvpair_without_the_frozen_log_pipe_w1_alone_delays_nobody_and_both_whales_are_blamed_as_measured() -> None:
    """Re-recorded with the 1 MiB log pipe (truth10): in the w1-alone world no short waits in vLLM's frontend any
    more (mean TTFT 10.4 ms against truth8's 111 ms, s002 0.38 s), so w1's true share is only s000's wait behind
    both serialized prefills (and s003's, r2), split about evenly with w2; the engine blames each within 1.1 %."""
    truth = truth_spread.load(TRUTH / "kvpair")
    for spec, e in truth["shorts"].items():
        cond = e["conditions"]
        assert cond["w1"]["ttft_s"]["mean"] < 2 * cond["none"]["ttft_s"]["mean"], spec
    s = score_truth(TRUTH / "kvpair", "attrib-agent", engine_blame, engine_itl_blame)
    assert (s.null_flagged, s.null_total) == (0, 12)
    assert s.whale_rel_errors["w1"] <= 0.011 and s.whale_rel_errors["w2"] <= 0.011  # measured 1.1 % and 0.6 %


def test_kvpair_names_exactly_the_requests_vllm_preempted_and_none_elsewhere() -> None:
    """vLLM preempted 1, 2 and 1 requests in kvpair's three w1+w2 runs (w2 each time, s003 too in r1; the client's
    streams stall 0.44-0.49 s there; truth10's re-recording with the 1 MiB log pipe, as truth8's had) and none in
    any other run of the held-out truths."""
    named: dict[str, list[str]] = {}
    for name in HELD_OUT:
        truth = json.loads((TRUTH / name / "truth.json").read_text())
        for r in truth["runs"]:
            results, _, spec = attributed(TRUTH / name / r["recording"])
            got = sorted(spec.get(x.request_id, x.request_id) for x in results if x.preempted_s > 0)
            meta = json.loads((TRUTH / name / r["recording"] / "meta.json").read_text())
            assert len(got) == meta["preemptions"], (name, r["recording"])
            if got:
                named[f"{name}/{r['recording']}"] = got
    assert named == {"kvpair/runs/w1+w2-r0": ["w2"], "kvpair/runs/w1+w2-r1": ["s003", "w2"],
                     "kvpair/runs/w1+w2-r2": ["w2"]}


def test_a_fit_kept_from_a_run_without_long_prompts_prices_the_held_out_whales_prefill_by_the_priors_shape() -> None:
    """whale1/w1 arrives before any step of its run. r0's agent starts from the fit of the null run before it
    (32-token prompts only), whose chunk terms were the prior's: its prefill was priced 1.29 s against the 0.46 s
    its four chunks took, and the harm forecast 3.5 s against 0.48 s. Since price11 a fit that never read a full
    chunk prices the prefill by the prior's shape at the pace it measured on the steps it read
    (`forecast_state.prior_shape`): 0.63 s (+32 %). r1 and r2 start from fits that have seen whale1's chunks:
    0.48 s each, the truth, until the eleventh session; since `prefill_factor` is a ratio of sums (the mean time
    of the fit's chunks, not the typical one) r1's is 0.507 s (+6 %), r2's 0.482 s. The mean over the three is
    0.54 s: 13 % off (was 212 %; 11 % with the median factor)."""
    by = {f"{c.truth}/{c.whale}": c for c in kept()}
    w1 = by["whale1/w1"]
    r0, r1, r2 = w1.forecast_s["declared"]
    assert math.isclose(r0, 0.631, abs_tol=0.01)  # 3.5 s by the fit's own split, before price11
    assert math.isclose(r1, 0.507, abs_tol=0.01) and math.isclose(r2, 0.482, abs_tol=0.01)
    assert abs(r1 - w1.true_harm_s) <= 0.07 * w1.true_harm_s and abs(r2 - w1.true_harm_s) <= 0.02 * w1.true_harm_s


def test_the_held_out_forecast_figures_as_measured() -> None:
    """Declared load, kept fit, over the five held-out whales (two resolved: whale1/w1, kvpair/w2; mixed/w1 too
    until truthse17 judged the net harm by the runs' spread, 0.143 +/- 0.126 s): median error 50 % over the four with
    a true harm (18 % over the resolved, 23 % with mixed/w1; the tuned truths' 28 % / 23 %);
    before price11's prior shape 82 % (82 %): whale1/w1 212 % -> 11 %, mixed/w1 82 % -> 77 %.
    mixed/w1 is called harmless in 1 of 3 recordings (r0: its 2 chunks priced 79 ms against the 152 ms they took, by
    a fit kept from a run whose longest chunk was 1,024 tokens, so the prefill ends before the first short arrives)
    though it makes m002 wait 5.4x, 20 standard errors past its noise: the issue's rule broken on held-out data.
    Since fit9 that price is flagged as beyond the fit's evidence (`forecast.PriceCheck`) and never called harmless:
    the figures stay, the verdict does not. kvpair re-recorded with the mended capture (truth10): kvpair/w1's 2x was
    s002 waiting in vLLM's frontend behind a full log pipe (truth8's recording); without it w1 alone harms nobody
    (true harm 0), so the 2 of 3 recordings that call it harmless are right, though not every one: mixed/w2, also
    truly harmless, is called harmless in every recording, kvpair/w1 not in r0 (priced beyond the evidence)."""
    s = summary(kept(), "declared")
    assert s["whales"] == 5 and s["resolved_whales"] == 2  # truthse17; 3 before
    assert math.isclose(s["median_rel_error"], 0.50, abs_tol=0.01)  # price11; truth10 0.82, truth8's kvpair 0.81
    assert math.isclose(s["median_rel_error_resolved"], 0.18, abs_tol=0.01)  # truthse17; 0.23 (price11), 0.82 before
    assert s["called_harmless_but_resolved_2x"] == []  # fit9; was ["mixed/w1"]
    assert s["called_harmless_but_2x"] == []  # truth10; was ["kvpair/w1"] (a frozen log pipe), before fit9 mixed/w1 too
    assert s["truly_harmless"] == ["mixed/w2", "kvpair/w1"]  # truth10: kvpair/w1 was 0.40 s of frontend waits
    assert s["truly_harmless_called_harmless"] == ["mixed/w2"]
    by = {f"{c.truth}/{c.whale}": c for c in kept()}
    assert by["mixed/w1"].harmless["declared"] == [False, False, False]  # fit9; was [True, False, False]
    assert by["kvpair/w1"].true_harm_s == 0.0 and by["kvpair/w1"].harmless["declared"] == [False, True, True]


B4096 = TRUTH / "whale2-b4096"  # whale2 on a vLLM with 4,096-token budgets, recorded after price11 was designed


@cache
def b4096(persisted: bool) -> dict[str, WhaleCase]:
    return {c.whale: c for c in score_dirs([B4096], persisted=persisted)}


def test_whale2_b4096_is_attributed_as_measured() -> None:
    """The fourth held-out truth, re-recorded with the ordered client (docs/attribution.md, "Eleventh session
    (truth13)"): s002 now reaches vLLM 3-5 ms before w2 in every run. Alone neither whale delays anyone; with both,
    vLLM's engine core (busy with w1's decode) took s002 and w2's first 4,063-token chunk in one step in two of three
    reps (s002 13 -> 205-211 ms). Its re-simulation runs s002 alone in the step before w2 arrives, so no world shows
    a whale to matter; the wait goes to the whales in s002's observed steps by what each cost there (seen13; before,
    it was left unexplained): per-whale error w1 89 %, w2 23 % (truth13's 96 % and 100 %; 37 % and 31 % before, the
    truth comparing two arrival orders), top-1 1/1 (one slowed short, s002, whose true top two are within two
    standard errors; 0/1 before), null 0/60, ITL w1 18 %, w2 12 % (was 32 % and 2 %)."""
    s = score_truth(B4096, "attrib-agent", engine_blame, engine_itl_blame)
    assert (s.top1_hits, s.top1_total) == (1, 1) and (s.null_flagged, s.null_total) == (0, 60)  # seen13; 0/1
    assert math.isclose(s.whale_rel_errors["w1"], 0.889, abs_tol=0.005)  # seen13; truth13 0.964, 0.369 before
    assert math.isclose(s.whale_rel_errors["w2"], 0.233, abs_tol=0.005)  # seen13; truth13 1.0, 0.311 before
    assert math.isclose(s.itl_whale_rel_errors["w1"], 0.184, abs_tol=0.005)  # truth13; 0.321 before
    assert math.isclose(s.itl_whale_rel_errors["w2"], 0.123, abs_tol=0.005)  # truth13; 0.015 before


def test_whale2_b4096s_forecast_as_measured_and_no_call_of_harmless() -> None:
    """Declared load, kept fit, on the re-recording (truth13: the ordered client, a quiet host). w2 (true harm
    0.190 +- 0.066 s, resolved: s002 13 -> 144 ms with both whales, mean of 3 reps; alone w2 delays nobody, since s002
    now runs first): 0.187 / 0.223 / 0.250 s (+16 %), never harmless; before, against the first recording's
    0.73 s, 0.195 / 0.231 / 0.695 s. w1 (true harm 0.008 +- 0.011 s, truly harmless: its first 4,096-token chunk
    took 175-208 ms in every rep, so s000, 0.5 s after it, never waits; the first recording's r1 and r2 took 374-388
    ms and s000 waited): 0.007 / 0.211 / 0.021 s, never called harmless. Its one call of harmless in the first
    recording (r2, the host's pace) is gone with the slow host. Cold fits price both whales beyond their evidence:
    never harmless."""
    kept_, cold = b4096(True), b4096(False)
    w1, w2 = kept_["w1"], kept_["w2"]
    assert math.isclose(w2.true_harm_s, 0.190, abs_tol=0.001) and w2.resolved and w2.true_resolved_2x
    assert math.isclose(w1.true_harm_s, 0.008, abs_tol=0.001) and not w1.resolved and not w1.true_slowed_2x
    assert w1.truly_harmless
    for case, want in ((w2, (0.187, 0.223, 0.250)), (w1, (0.007, 0.211, 0.021))):
        assert all(math.isclose(a, b, abs_tol=0.005) for a, b in zip(case.forecast_s["declared"], want, strict=True))
    assert w2.harmless == {"learnt": [False] * 3, "declared": [False] * 3}  # fcast12; declared r1 was True
    assert w1.harmless == {"learnt": [False] * 3, "declared": [False] * 3}  # truth13; declared r2 was True
    assert all(not any(c.harmless[k]) and all(c.extrapolated[k]) for c in cold.values() for k in ("learnt", "declared"))


def test_the_seven_held_out_whales_forecast_figures_as_measured() -> None:
    """Declared load, kept fit, over the seven held-out whales (whale1, mixed, kvpair, whale2-b4096; six with a true
    harm, three resolved since truthse17, four before): median error 50 % (16 % over the resolved, 19 % before; the
    twelve tuned whales' 34 % / 28 %); before truth13 re-recorded whale2-b4096 63 % (36 %), before fcast12 75 % (48 %).
    Called harmless though a short slowed 2x: none (whale2-b4096/w1 in 1 of 3 recordings before truth13; now truly
    harmless, never called harmless)."""
    s = summary([*kept(), *b4096(True).values()], "declared")
    assert s["whales"] == 7 and s["resolved_whales"] == 3  # truthse17 (mixed/w1 unresolved); 4 before
    assert math.isclose(s["median_rel_error"], 0.50, abs_tol=0.01)  # truth13; 0.63 (fcast12), 0.75 before
    assert math.isclose(s["median_rel_error_resolved"], 0.16, abs_tol=0.01)  # truthse17; 0.19 (truth13), 0.36, 0.48
    assert s["called_harmless_but_2x"] == []  # truth13; ["whale2-b4096/w1"] before
    assert s["called_harmless_but_resolved_2x"] == []
    assert s["truly_harmless"] == ["mixed/w2", "kvpair/w1", "whale2-b4096/w1"]  # truth13


def test_mixed_w1_r2_on_the_learnt_load_is_not_harmless_its_prefill_is_where_the_next_short_likely_lands() -> None:
    """Issue 16's last break (learnt load, kept fit, `lab forecast-score --persisted`): at w1's arrival in mixed's
    r2 the learnt stream (2.47/s, phase unknown) puts its next short half a gap ahead, 0.20 s, after w1's prefill
    priced 0.11 s, so the runs harm nobody and w1 was called harmless; m002 came 0.106 s after w1 and waited for
    its prefill, 5x its TTFT without (the truth's resolved 2x). A Poisson stream of that rate lands in the prefill
    25 % of the time: at the default bound (5 %) w1 is not harmless. mixed/w2, truly harmless, looks alike at
    its arrivals (15-28 %): no longer called harmless on the learnt load either (it was in all 3 recordings)."""
    d = TRUTH / "mixed"
    truth = json.loads((d / "truth.json").read_text())
    w = truth["whales"]["w1"]
    cfg = ForecastConfig()
    f = forecast_at_arrival(d / "runs/w1-r2", "w1", Candidate(w["prompt_tokens"], w["output_tokens"]),
                            {"learnt": (None, cfg)}, {}, None, persisted_states(truth, d)["runs/w1-r2"])["learnt"]
    assert f.load_basis == "learnt+saved" and f.expected_load is not None and f.expected_load.first_in_s is None
    assert f.expected_load.rate_per_s == pytest.approx(2.36, abs=0.01)  # 2.47 before (n - 1) / span (learnt15)
    assert f.ttft_extra_sum_s < cfg.harmless_s and f.in_flight.slowed == f.expected.slowed == 0  # the runs: no harm
    assert not f.extrapolated and f.harmless(replace(cfg, harmless_arrival_chance=1.01))  # so harmless, before
    assert f.arrival_chance == pytest.approx(0.239, abs=0.005)  # 0.248 at 2.47/s
    assert not f.harmless(cfg)
    by = {f"{c.truth}/{c.whale}": c for c in kept()}
    assert by["mixed/w1"].true_resolved_2x and by["mixed/w1"].harmless["learnt"] == [False] * 3  # was r2 True
    assert by["mixed/w2"].truly_harmless and by["mixed/w2"].harmless["learnt"] == [False] * 3  # was [True] * 3
    s = summary([*kept(), *b4096(True).values()], "learnt")
    assert s["called_harmless_but_2x"] == [] and s["truly_harmless_called_harmless"] == []


B1024 = TRUTH / "continuous-b1024"  # continuous on a vLLM with 1,024-token budgets and 48 MiB of KV (truth14)


@cache
def b1024(persisted: bool) -> dict[str, WhaleCase]:
    return {c.whale: c for c in score_dirs([B1024], persisted=persisted)}


def test_continuous_b1024_was_recorded_as_its_command_says_and_its_whales_slow_nobody_2x() -> None:
    """The fifth held-out truth (eleventh session, truth14): `continuous` on a vLLM started with
    `--max-num-batched-tokens=1024` and a 48 MiB KV pool (192 blocks of 128), a budget and a pool no other truth has.
    Every recording opens with vLLM's budget line; 12 runs accepted at the first attempt, no preemption. On a quiet
    host and 1,024-token chunks no short's mean TTFT doubles in any condition (at most 1.73x: c014 with w1 alone)."""
    truth = truth_spread.load(B1024)
    assert len(truth["runs"]) == 12 and all(r["accepted"] for r in truth["runs"])
    for r in truth["runs"]:
        meta = json.loads((B1024 / r["recording"] / "meta.json").read_text())
        assert (meta["num_gpu_blocks"], meta["model"]["kv_cache_bytes"], meta["attempt"]) == (192, 50331648, 1)
        assert meta["preemptions"] == 0 and meta["log_pipe_bytes"] == 1 << 20
        first = next(Recording(B1024 / r["recording"]).records(LOG))["line"]
        assert "max_num_batched_tokens=1024." in first, r["recording"]
    worst = max(c["ttft_s"]["mean"] / e["conditions"]["none"]["ttft_s"]["mean"]
                for e in truth["shorts"].values() for c in e["conditions"].values())
    assert math.isclose(worst, 1.73, abs_tol=0.01)


def test_continuous_b1024_is_attributed_as_measured_nobody_blamed() -> None:
    """The agent blames neither whale any TTFT in any of the nine runs with a whale (nor anyone in the 120 null
    shorts), and w1 a few ms of ITL. The truth's clipped Shapley shares are 27 ms (w1, +- 12 ms) and 3 ms (w2)
    summed over 40 shorts, none over 5 ms a short, so the per-whale error reads 100 % for both and top-1 has no case
    (no short slowed 2x)."""
    s = score_truth(B1024, "attrib-agent", engine_blame, engine_itl_blame)
    assert (s.top1_hits, s.top1_total) == (0, 0) and (s.null_flagged, s.null_total) == (0, 120)
    assert s.whale_rel_errors == {"w1": 1.0, "w2": 1.0} and s.itl_whale_rel_errors["w2"] == 1.0
    # w1's ITL: 0.1-4.9 ms a run blamed on it since `lab score` replays the whole recording (nu17: the 30 s window
    # dropped the shorts decoding beside it); 1.0 before
    assert 0.6 < s.itl_whale_rel_errors["w1"] < 0.8
    truth = truth_spread.load(B1024)
    totals = truth_spread.whale_totals(truth)
    assert math.isclose(totals["w1"][0], 0.027, abs_tol=0.001) and math.isclose(totals["w2"][0], 0.003, abs_tol=0.001)
    for r in truth["runs"]:
        if r["condition"] != "none":
            blamed = engine_blame(B1024 / r["recording"]).values()
            assert all(per.get(w, 0.0) == 0.0 for per in blamed for w in ("w1", "w2")), r["recording"]


def test_continuous_b1024s_forecast_as_measured() -> None:
    """w1 (3,900 tokens at 15 s): true harm 0.035 s clipped, net 0.027 +/- 0.023 s: unresolved since truthse17 (the
    clipped harm was >= 2 standard errors with the shorts independent), so truly harmless; no short slowed 2x, under
    `harmless_s` (50 ms). Declared kept forecasts 2.3 / 1.7 / 1.5 ms (-95 %); learnt kept 11 / 6 / 13 ms, never
    harmless. Until decl15 every one was priced beyond the fit's evidence (2.3 / 0.3 / 0.8 ms), so never harmless:
    the kept fits had read w1's last chunk (828 tokens over 3,072 of context) in the run before and forgotten it,
    evicted by the stream's 1,024-token prompts kept in the same class (`cost_model.kept_class`). Now r1 and r2 rest
    on it and the declared load calls them harmless; r0's fit never saw a whale (cold before it), still flagged.
    w2 (2,500 tokens at 27 s): truly harmless, called harmless by the declared load in every recording, kept and
    cold (0 / 0 / 8.3 ms), never by the learnt load (3-9 ms)."""
    kept_, cold = b1024(True), b1024(False)
    w1, w2 = kept_["w1"], kept_["w2"]
    assert math.isclose(w1.true_harm_s, 0.035, abs_tol=0.001) and not w1.resolved and not w1.true_slowed_2x
    assert w1.truly_harmless  # truthse17
    assert w2.true_harm_s == 0.0 and w2.truly_harmless
    for case, want in ((w1, (0.0023, 0.0017, 0.0015)), (w2, (0.0, 0.0, 0.0083))):
        assert all(math.isclose(a, b, abs_tol=0.0005) for a, b in zip(case.forecast_s["declared"], want, strict=True))
    assert w1.harmless == {"learnt": [False] * 3, "declared": [False, True, True]}
    assert w1.extrapolated["declared"] == [True, False, False] and all(cold["w1"].extrapolated["declared"])
    assert w2.harmless == {"learnt": [False] * 3, "declared": [True] * 3}
    assert cold["w2"].harmless == {"learnt": [False] * 3, "declared": [True] * 3}


def test_the_nine_held_out_whales_forecast_figures_as_measured() -> None:
    """Declared load, kept fit, over the nine held-out whales (seven with a true harm, three resolved since truthse17,
    five before): median error 77 % (16 % over the resolved; 23 % before), against the seven before continuous-b1024
    joined, 50 % (19 %): its w1 (-97 %) is the resolved held-out whale priced furthest below its harm (mixed/w1 -77 %).
    Called harmless though a short slowed 2x: none; truly harmless called harmless in every recording: mixed/w2 and
    continuous-b1024/w2, 2 of 5 (continuous-b1024/w1 joined them with truthse17: called harmless in 2 of 3). Learnt
    load, kept fit: 74 % (58 % over the resolved, 74 % before truthse17), never harmless when a short slowed 2x (60 %
    (60 %) before the twelfth session's prompt classes and (n - 1) / span rate: kvpair/w2 -55 % -> +76 %,
    docs/forecast.md)."""
    s = summary([*kept(), *b4096(True).values(), *b1024(True).values()], "declared")
    assert s["whales"] == 9 and s["resolved_whales"] == 3  # truthse17; 5 before
    assert math.isclose(s["median_rel_error"], 0.77, abs_tol=0.01)
    assert math.isclose(s["median_rel_error_resolved"], 0.16, abs_tol=0.01)  # truthse17; 0.23 before
    assert s["called_harmless_but_2x"] == [] and s["called_harmless_but_resolved_2x"] == []
    assert s["truly_harmless_called_harmless"] == ["mixed/w2", "continuous-b1024/w2"]
    learnt = summary([*kept(), *b4096(True).values(), *b1024(True).values()], "learnt")
    assert math.isclose(learnt["median_rel_error"], 0.74, abs_tol=0.01) and learnt["called_harmless_but_2x"] == []
    assert math.isclose(learnt["median_rel_error_resolved"], 0.58, abs_tol=0.01)  # truthse17; 0.74 before
