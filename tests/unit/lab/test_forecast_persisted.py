"""`lab forecast-score --persisted`: each recording's agent starts from the fit the agent that replayed the
truth's previous recording saved in its state_dir (a restarted sidecar on the same machine). On
preempt-midstream both whales arrive before the agent has seen a step, so cold they are priced by the prior; kept,
by the machine's own earlier steps. Both come before any short too: cold, the learnt load knows nobody to expect
and runs the probe (the next arrival's wait; it called them harmless before the probe); kept, it expects the
short stream the previous run's agent saw (saved with the fit)."""

from __future__ import annotations

from pathlib import Path

import pytest

from attrib_agent.lab.forecast_score import format_side_by_side, score_dirs

TRUTH = Path(__file__).resolve().parents[2] / "fixtures" / "truth" / "preempt-midstream"


def test_each_recording_starts_from_the_previous_agents_saved_fit_and_forecasts_closer() -> None:
    cold = score_dirs([TRUTH])
    kept = score_dirs([TRUTH], persisted=True)
    for c, k in zip(cold, kept, strict=True):
        runs = len(k.forecast_s["declared"])
        assert k.fits == {"loaded": runs}  # every recording had a predecessor, all the same engine
        err_cold = abs(c.mean("declared") - c.true_harm_s)  # type: ignore[operator]
        err_kept = abs(k.mean("declared") - k.true_harm_s)  # type: ignore[operator]
        assert err_kept < err_cold, (k.whale, c.mean("declared"), k.mean("declared"), k.true_harm_s)
        assert k.true_slowed_2x and not any(c.harmless["learnt"]) and not any(k.harmless["learnt"])
        # cold: the probe, the same in every recording but for the time w1 has waited on an idle engine at w2's
        # arrival in one of them, its chunk then under way (decl15's `forecast_sim.busy_since`: under 1 us)
        assert c.mean("learnt") == pytest.approx(c.forecast_s["learnt"][0], rel=1e-5)
        assert c.forecast_s["learnt"][0] > 0.05
        assert all(x >= 0.05 for x in k.forecast_s["learnt"])  # harmful in every recording: never "harmless"
        # what it forecasts is harm, not noise: since learnt15 the whales in flight are priced at their real
        # prompts (the saved prompt classes), and w2's harm is then over by the stream the learnt load expects for
        # the whole 10 s horizon, where the truth's ends after 2-4 s (w2: 166 s against 77 s; within 2x before, a
        # wrong 512-token guess cancelling that)
        assert k.true_harm_s / 2 < k.mean("learnt") < 3 * k.true_harm_s  # type: ignore[operator]
    text = format_side_by_side(cold, kept)
    assert "declared kept s" in text and "loaded" in text



def test_a_restarted_agent_prices_steps_with_the_gap_the_last_one_measured() -> None:
    """preempt/w3 comes 0.3 s into its run, after three steps: too few to measure the gap between steps. Its harm
    is the shorts queued until the two earlier whales have decoded their 800 tokens (w3 itself preempted back to
    the queue's head). With the fit's gap (the prior's 1.5 ms) those decode steps were priced 1.4x what the
    machine took (its steps ran 0.3-0.8 ms apart) and the harm forecast 16.7 s against 10.8 s; with the gap the
    previous run's agent measured and saved, 8.2 s (the first recording). On truth11's re-recording with the mended
    capture: 9.9 s (8.5, 7.7 and 13.4 over the three recordings) against 10.6 s."""
    kept = {c.whale: c for c in score_dirs([TRUTH.parent / "preempt"], persisted=True)}
    w3 = kept["w3"]
    assert w3.fits == {"loaded": 3} and w3.resolved
    forecast = w3.mean("declared")
    assert forecast is not None and abs(forecast - w3.true_harm_s) < 0.3 * w3.true_harm_s, forecast
