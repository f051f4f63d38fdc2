"""The step-cost fit's snapshot (what the agent's state file holds) and its restore: a round trip prices as the
saved fit did, a restore into a model that has seen steps keeps those as the newest, and a bad snapshot changes
nothing."""

from __future__ import annotations

import json
import random

import pytest

from attrib_agent.attribution.cost_model import (
    FIT_WINDOW,
    KEPT_PER_SIZE,
    SIZE_CLASSES,
    PriceRange,
    StepCostModel,
    prefill_pairs,
    seen_range,
)


def machine(model: StepCostModel, n: int, seed: int, per_token: float) -> None:
    """Steps of a machine whose prefill costs `per_token` a token: decode steps, one long chunk in 50."""
    rnd = random.Random(seed)
    for i in range(n):
        chunk = 2048 if i % 50 == 0 else 0
        decode = rnd.randint(1, 8)
        model.observe(chunk, decode, decode * 300, 0.002 + per_token * chunk + 0.0005 * decode,
                      prefill_requests=1 if chunk else 0)


def test_a_round_trip_prices_as_the_saved_fit_and_is_plain_json() -> None:
    saved = StepCostModel()
    machine(saved, 3000, 1, 2e-4)
    snap = json.loads(json.dumps(saved.snapshot(), allow_nan=False))
    assert len(snap["rows"]) == FIT_WINDOW and all(len(k) <= KEPT_PER_SIZE for k in snap["kept"])
    fresh = StepCostModel()
    fresh.restore(snap)
    assert fresh.fitted and fresh.coefficients == saved.coefficients
    assert fresh.solo_ttft_s(6000, 2048) == saved.solo_ttft_s(6000, 2048)
    assert fresh.solo_ttft_s(6000, 2048) > 2 * StepCostModel().solo_ttft_s(6000, 2048)  # the prior is 3x off


def test_steps_seen_before_the_restore_stay_the_newest() -> None:
    saved = StepCostModel()
    machine(saved, 600, 2, 2e-4)
    mine = StepCostModel()
    machine(mine, 100, 3, 2e-4)
    newest = list(mine._rows)
    mine.restore(saved.snapshot())
    assert list(mine._rows)[-len(newest):] == newest and mine.window_steps == 700
    assert min(seq for seq, _, _ in mine._rows) < 0 <= min(seq for seq, _, _ in newest)
    assert mine.fitted  # refitted on both
    mine.forget_restored()
    assert list(mine._rows) == newest


@pytest.mark.parametrize("damage", ["rows", "coefficients", "kept", "steps_seen", "seq", "nan"])
def test_a_bad_snapshot_is_refused_and_changes_nothing(damage: str) -> None:
    saved = StepCostModel()
    machine(saved, 300, 4, 2e-4)
    snap = saved.snapshot()
    if damage == "rows":
        snap["rows"][3] = [1, 2]
    elif damage == "coefficients":
        snap["coefficients"] = snap["coefficients"][:5]
    elif damage == "kept":
        snap["kept"] = snap["kept"][: SIZE_CLASSES - 1]
    elif damage == "steps_seen":
        snap["steps_seen"] = -1
    elif damage == "seq":
        snap["rows"][0][0] = snap["steps_seen"]
    else:
        snap["rows"][0][-1] = float("nan")
    model = StepCostModel()
    machine(model, 10, 5, 1e-4)
    before = (list(model._rows), model.coefficients, model.fitted)
    with pytest.raises(ValueError):
        model.restore(snap)
    assert (list(model._rows), model.coefficients, model.fitted) == before


def test_the_state_file_keeps_the_load_it_was_given_and_reads_files_without_one() -> None:
    from attrib_agent.attribution.fit_snapshot import EngineFingerprint, decode, encode
    from attrib_agent.attribution.forecast_types import ArrivalLoad

    model = StepCostModel()
    machine(model, 100, 2, 2e-4)
    engine = EngineFingerprint(0, "m", "CPU", 16, 96, None)
    load = ArrivalLoad(1.5, 32, 64, cached_prefix_tokens=16)
    assert decode(encode(engine, model, load)).load == load
    assert decode(encode(engine, model)).load is None  # a file written before the load was kept
    doc = json.loads(encode(engine, model, load))
    for bad in ({"rate_per_s": float("inf")}, {"rate_per_s": -1.0}, {"prompt_tokens": 0}, {"extra": 1}):
        with pytest.raises(ValueError, match="load"):
            decode(json.dumps(doc | {"load": doc["load"] | bad}).encode())


def test_the_state_file_keeps_the_measured_step_gap_and_reads_files_without_one() -> None:
    """The gap between steps the saving agent measured (forecast_state.last_gap) rides along: a restarted agent's
    whale may come before it has seen enough steps to measure its own."""
    from attrib_agent.attribution.fit_snapshot import EngineFingerprint, decode, encode

    model = StepCostModel()
    machine(model, 100, 3, 2e-4)
    engine = EngineFingerprint(0, "m", "CPU", 16, 96, None)
    assert decode(encode(engine, model, None, 6e-4)).step_gap_s == 6e-4
    assert decode(encode(engine, model, None, -1e-4)).step_gap_s == -1e-4  # log stamps jitter: a mean may be < 0
    assert decode(encode(engine, model)).step_gap_s is None  # a file written before the gap was kept
    doc = json.loads(encode(engine, model, None, 6e-4))
    for bad in (float("inf"), 2.0, "1", True, [1e-3]):
        with pytest.raises(ValueError, match="step_gap_s"):
            decode(json.dumps(doc | {"step_gap_s": bad}).encode().replace(b"Infinity", b"1e999"))


def test_the_prefill_the_fit_rests_on_is_recorded_at_the_fit_and_kept_across_restarts() -> None:
    """`price_range`: the largest prefill chunk (tokens, attention pairs) of the steps the coefficients were fitted
    on (issue 16: the forecast flags a price beyond it). Empty under the prior; a step observed but not yet fitted
    is not evidence; a restored fit brings the range of the window it was fitted on; forgetting it, it goes."""
    model = StepCostModel(min_steps=64, refit_every=128)
    def seen(m: StepCostModel) -> tuple[int, int]:
        return m.price_range.prefill_tokens, m.price_range.prefill_pairs

    assert model.price_range == PriceRange(0, 0, 0) and not model.fitted
    machine(model, 64, 5, 2e-4)  # the first fit, at step 64: one 2,048-token chunk in 50 (pairs not given)
    assert model.fitted and seen(model) == (2048, 0)
    model.observe(4096, 0, 0, 1.0, prefill_pairs=prefill_pairs(2048, 4096), prefill_requests=1)
    assert seen(model) == (2048, 0)  # seen, not yet fitted
    model.refit()
    assert seen(model) == (4096, prefill_pairs(2048, 4096))
    fresh = StepCostModel()
    fresh.restore(json.loads(json.dumps(model.snapshot())))
    assert fresh.price_range == model.price_range  # adopted with the fit
    mine = StepCostModel(min_steps=64)
    machine(mine, 100, 6, 2e-4)
    mine.restore(model.snapshot())  # refitted on both: the larger chunk is in the merged window
    assert seen(mine) == (4096, prefill_pairs(2048, 4096))
    mine.forget_restored()
    assert seen(mine) == (2048, 0)
    assert seen_range([]) == PriceRange(0, 0, 0)
    # the decodes beside the largest chunk took their share of the budget: a chunk that much longer is covered
    r = PriceRange(2046, 2046 * 2047 // 2, beside=2)
    assert r.covers(2048, 2048 * 2049 // 2) and not r.covers(2049, 1000) and not r.covers(2048, 2048 * 2049)
    assert seen_range([((1.0, 2046.0, 2.0, 500.0, 9.0, 1.0), 0.1), ((1.0, 2046.0, 5.0, 900.0, 4.0, 1.0), 0.1),
                       ((1.0, 0.0, 9.0, 900.0, 0.0, 0.0), 0.01)]) == PriceRange(2046, 9, 5)
