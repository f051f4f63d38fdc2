"""The baseline step-cost model: prior until fitted, robust non-negative fit, bounded window, solo TTFT/ITL."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.attribution import cost_model
from attrib_agent.attribution.cost_model import (
    StepCostModel,
    StepCostPrior,
    StepFeatures,
    kept_class,
    prefill_pairs,
)
from attrib_agent.attribution.sim_trace import Member, Pricer, StepPrices
from attrib_agent.attribution.sim_types import PrefillAwareStepCost, StepCost
from attrib_agent.timeline.model import StepMember, StepRecord

TRUE = StepCostPrior(intercept_s=0.004, per_prefill_token_s=8e-5, per_decode_request_s=5e-4,
                     per_decode_context_token_s=4e-7, per_prefill_pair_s=2e-8, step_gap_s=0.001,
                     per_prefill_request_s=1.5e-3)


def true_seconds(f: StepFeatures) -> float:
    return (TRUE.intercept_s + TRUE.per_prefill_token_s * f.prefill_tokens + TRUE.per_decode_request_s
            * f.decode_requests + TRUE.per_decode_context_token_s * f.decode_context_sum
            + TRUE.per_prefill_pair_s * f.prefill_pairs + TRUE.per_prefill_request_s * f.prefill_requests)


def random_step(rng: random.Random) -> StepFeatures:
    """A mix like a real engine's: mostly decode batches, some short prefills, some long-context chunks."""
    decoders = [rng.randint(32, 8000) for _ in range(rng.randint(0, 6))]
    kind = rng.random()
    if kind < 0.6:
        tokens, prior = 0, 0
    elif kind < 0.85:
        tokens, prior = rng.randint(16, 1024), 0
    else:
        tokens, prior = 2048 - len(decoders), rng.choice([0, 2048, 4096, 6144])
    if tokens == 0 and not decoders:
        decoders = [rng.randint(32, 8000)]
    return StepFeatures(tokens, len(decoders), sum(decoders), prefill_pairs(prior, tokens) if tokens else 0,
                        1 if tokens else 0)


def feed(model: StepCostModel, n: int, seed: int = 1, noise: float = 0.0005, outliers: float = 0.0) -> None:
    rng = random.Random(seed)
    for _ in range(n):
        f = random_step(rng)
        y = true_seconds(f) + rng.gauss(0, noise)
        if rng.random() < outliers:
            y += rng.uniform(0.05, 0.3)  # a hiccup: GC, another process, a page fault storm
        model.observe_features(f, max(y, 0.0), gap_s=TRUE.step_gap_s + rng.gauss(0, 0.0005))


def test_implements_the_simulator_protocols() -> None:
    model: StepCost = StepCostModel()  # checked by mypy
    assert isinstance(model, PrefillAwareStepCost)


def test_prior_until_enough_steps_then_fitted() -> None:
    prior = StepCostPrior()
    model = StepCostModel(prior, min_steps=50)
    feed(model, 49)
    assert not model.fitted and model.residual_scale is None
    assert model.coefficients.as_tuple() == prior.as_tuple()
    assert model.step_seconds(0, 1, 100) == pytest.approx(prior.intercept_s + prior.per_decode_request_s
                                                          + 100 * prior.per_decode_context_token_s
                                                          + prior.step_gap_s)
    feed(model, 1, seed=2)
    assert model.fitted and model.residual_scale is not None


def test_recovers_coefficients_despite_outliers() -> None:
    model = StepCostModel(StepCostPrior(), min_steps=64, max_window=1024)
    feed(model, 1024, outliers=0.05)
    model.refit()
    c = model.coefficients
    assert c.per_prefill_token_s == pytest.approx(TRUE.per_prefill_token_s, rel=0.1)
    assert c.per_decode_context_token_s == pytest.approx(TRUE.per_decode_context_token_s, rel=0.1)
    assert c.per_prefill_pair_s == pytest.approx(TRUE.per_prefill_pair_s, rel=0.1)
    assert c.per_prefill_request_s == pytest.approx(TRUE.per_prefill_request_s, rel=0.2)
    assert c.intercept_s == pytest.approx(TRUE.intercept_s, abs=0.001)
    # 5% hiccups of 50-300 ms: a least-squares fit would be dragged far off; Huber barely moves.
    rng = random.Random(9)
    errors = [abs(model.step_seconds_with_prefill(f.prefill_tokens, f.decode_requests, f.decode_context_sum,
                                                  f.prefill_pairs, f.prefill_requests) - c.step_gap_s
                  - true_seconds(f))
              for f in (random_step(rng) for _ in range(200))]
    assert max(errors) < 0.01
    assert model.residual_scale is not None and model.residual_scale < 0.002


def test_unexercised_feature_keeps_its_prior() -> None:
    prior = StepCostPrior(per_prefill_pair_s=3e-8, per_prefill_token_s=7e-5)
    model = StepCostModel(prior, min_steps=20)
    rng = random.Random(3)
    for _ in range(200):  # decode only: prefill terms never seen
        k = rng.randint(1, 6)
        f = StepFeatures(0, k, k * rng.randint(100, 5000))
        model.observe_features(f, true_seconds(f))
    c = model.coefficients
    assert c.per_prefill_pair_s == prior.per_prefill_pair_s
    assert c.per_prefill_token_s == prior.per_prefill_token_s
    assert c.per_decode_context_token_s == pytest.approx(TRUE.per_decode_context_token_s, rel=0.05)


def test_refits_as_the_data_changes_and_the_window_is_bounded() -> None:
    model = StepCostModel(min_steps=32, refit_every=32, max_window=256)
    for _ in range(400):
        model.observe(0, 2, 2000, 0.010)
    assert model.step_seconds(0, 2, 2000) - model.coefficients.step_gap_s == pytest.approx(0.010, rel=0.02)
    for _ in range(400):  # the machine got twice as slow: the window forgets the old regime
        model.observe(0, 2, 2000, 0.020)
    assert model.step_seconds(0, 2, 2000) - model.coefficients.step_gap_s == pytest.approx(0.020, rel=0.02)
    assert model.window_steps == 256 and len(model._gaps) <= 256
    assert model.steps_seen == 800


def test_bad_observations_are_counted_not_fitted() -> None:
    model = StepCostModel(min_steps=1)
    model.observe(0, 1, 10, float("nan"))
    model.observe(0, 1, 10, -1.0)
    model.observe(-5, 1, 10, 0.01)
    assert model.skipped == 3 and model.steps_seen == 0 and not model.fitted


def test_rejects_bad_configuration() -> None:
    with pytest.raises(ValueError):
        StepCostPrior(intercept_s=-1.0)
    with pytest.raises(ValueError):
        StepCostModel(min_steps=10, max_window=5)
    with pytest.raises(ValueError):
        StepCostModel().solo_ttft_s(100, 0)


def test_solo_ttft_is_the_prefill_in_budget_chunks() -> None:
    model = StepCostModel(TRUE)
    one = model.step_seconds_with_prefill(2048, 0, 0, prefill_pairs(0, 2048), 1)
    assert model.solo_ttft_s(2048, 2048) == pytest.approx(one)
    chunks = [(0, 2048), (2048, 2048), (4096, 904)]  # 5000 tokens: the first token comes with the last chunk
    expected = sum(model.step_seconds_with_prefill(n, 0, 0, prefill_pairs(p, n), 1) for p, n in chunks)
    assert model.solo_ttft_s(5000, 2048) == pytest.approx(expected)
    assert model.solo_ttft_s(5000, 8192) < model.solo_ttft_s(5000, 2048)  # fewer steps, same attention work


def test_solo_itl_is_one_decode_step_and_grows_with_context() -> None:
    model = StepCostModel(TRUE)
    assert model.solo_itl_s(1000) == pytest.approx(model.step_seconds(0, 1, 1000))
    assert model.solo_itl_s(8000) > model.solo_itl_s(1000) > 0


def test_features_from_a_timeline_step() -> None:
    record = StepRecord(engine=0, iteration=7, end_ts=1.0, elapsed_s=0.2, context_requests=1, context_tokens=2000,
                        generation_requests=2, generation_tokens=2, kv_usage=0.5,
                        members=(StepMember("w", "prefill", 2000, 6000, 47), StepMember("a", "decode", 1, 40, 1),
                                 StepMember("b", "decode", 1, 900, 8)))
    f = StepFeatures.from_record(record)
    assert f == StepFeatures(2000, 2, 940, prefill_pairs(4000, 2000), 1)
    bare = StepRecord(engine=0, iteration=8, end_ts=1.0, elapsed_s=0.2, context_requests=1, context_tokens=32,
                      generation_requests=2, generation_tokens=40, kv_usage=0.5)
    assert StepFeatures.from_record(bare) == StepFeatures(32 + 38, 2, 0, 0, 1)  # a resumed request's recompute


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 4096), st.integers(0, 64), st.integers(0, 200_000),
                          st.integers(0, 10**8), st.floats(0.0, 2.0)), min_size=8, max_size=80))
def test_any_data_gives_finite_non_negative_coefficients(rows: list[tuple[int, int, int, int, float]]) -> None:
    model = StepCostModel(min_steps=8, refit_every=8, max_window=64)
    for t, r, c, p, y in rows:
        model.observe_features(StepFeatures(t, r, c, p), y)
    coefficients = model.coefficients.as_tuple() + (model.coefficients.step_gap_s,)
    assert all(v >= 0 and v == v and v != float("inf") for v in coefficients)
    assert model.step_seconds(100, 3, 3000) > 0


def test_a_window_of_short_prefills_does_not_extrapolate_wildly_to_a_whale_chunk() -> None:
    # Only 32-token prefills: their tokens and attention pairs move together, so the data cannot separate the
    # two terms; the fit must not hand the difference to the pair term (2M pairs in a whale chunk, 528 here).
    model = StepCostModel(StepCostPrior(), min_steps=32)
    rng = random.Random(5)
    for _ in range(600):
        f = StepFeatures(32, 1, 200, prefill_pairs(0, 32)) if rng.random() < 0.1 else \
            StepFeatures(0, rng.randint(1, 3), rng.randint(40, 300))
        model.observe_features(f, true_seconds(f) + 0.002 * (f.prefill_tokens > 0) + rng.gauss(0, 0.0003))
    model.refit()
    whale_chunk = StepFeatures(2048, 0, 0, prefill_pairs(4096, 2048))
    predicted = model.step_seconds_with_prefill(2048, 0, 0, whale_chunk.prefill_pairs) - model.coefficients.step_gap_s
    assert 0.5 < predicted / true_seconds(whale_chunk) < 2.0


SLOW = StepCostPrior(intercept_s=0.01, per_prefill_token_s=3e-4, per_decode_request_s=5e-4,
                     per_decode_context_token_s=4e-7, per_prefill_pair_s=1e-7, step_gap_s=0.001)


def slow_seconds(f: StepFeatures) -> float:
    """A step's time on a slow machine (`SLOW`'s prices, no gap): what the kept-chunk tests feed the fit."""
    return sum(c * v for c, v in zip(SLOW.as_tuple(), f.row(), strict=True))


def test_a_whales_chunks_are_remembered_past_the_window() -> None:
    # A whale's three long chunks, then a thousand decode steps: the window of recent steps no longer holds
    # them, yet they are what priced a long chunk. Kept per chunk size, they still do (and memory stays bounded).
    model = StepCostModel(min_steps=64, refit_every=64, max_window=256)
    rng = random.Random(3)
    for done in (0, 2048, 4096):
        chunk = StepFeatures(2047, 1, 40, prefill_pairs(done, 2047))
        model.observe_features(chunk, slow_seconds(chunk))
    for i in range(1000):
        f = StepFeatures(32, 1, 60, prefill_pairs(0, 32)) if i % 20 == 0 else StepFeatures(0, 2, rng.randint(80, 400))
        model.observe_features(f, slow_seconds(f) + rng.gauss(0, 0.0003))
    model.refit()
    chunk = StepFeatures(2048, 0, 0, prefill_pairs(2048, 2048))
    predicted = model.step_seconds_with_prefill(2048, 0, 0, chunk.prefill_pairs) - model.coefficients.step_gap_s
    assert predicted == pytest.approx(slow_seconds(chunk), rel=0.1)
    assert model.window_steps == 256 and sum(len(k) for k in model._kept) <= 7 * 32


def test_a_whales_deep_chunks_are_kept_apart_from_a_streams_fresh_chunks_of_the_same_size() -> None:
    # A 1,024-token budget: a 3,900-token whale's four chunks, then a stream whose prompts are a full chunk each
    # (40 of them, more than a class keeps) and decode steps past the window. The whale's later chunks attend over
    # 1,024-3,072 tokens of context: kept by their tokens alone they shared a class with the stream's fresh
    # chunks, which evicted them, and the fit no longer covered a chunk that deep (continuous-b1024's kept fits).
    model = StepCostModel(min_steps=64, refit_every=64, max_window=256)
    rng = random.Random(4)
    deepest = prefill_pairs(3072, 828)
    for done, n in ((0, 1024), (1024, 1024), (2048, 1024), (3072, 828)):
        chunk = StepFeatures(n, 0, 0, prefill_pairs(done, n), 1)
        model.observe_features(chunk, slow_seconds(chunk))
    for i in range(1200):
        f = StepFeatures(1024, 1, 60, prefill_pairs(0, 1024), 1) if i % 30 == 0 else StepFeatures(
            0, 2, rng.randint(80, 400))
        model.observe_features(f, slow_seconds(f) + rng.gauss(0, 0.0003))
    model.refit()
    assert model.price_range.prefill_pairs == deepest  # by tokens alone: prefill_pairs(0, 1024), the stream's
    assert model.price_range.covers(828, deepest)
    assert kept_class(1024, prefill_pairs(0, 1024)) == kept_class(1024, 0) == 5  # a fresh chunk: by its size
    assert kept_class(828, deepest) == 6 and kept_class(32, prefill_pairs(6000, 32)) == 5
    assert sum(len(k) for k in model._kept) <= 7 * 32


def test_deferred_fits_once_on_the_window_of_the_last_refit_due() -> None:
    """A batch observed under `deferred()` refits once, at its end, on the window the last refit due in it
    would have read: the coefficients of refitting all the way, to the IRLS tolerance (only the warm start of
    superseded refits is missing), and none while the batch runs."""
    eager, lazy = StepCostModel(min_steps=64, refit_every=128), StepCostModel(min_steps=64, refit_every=128)
    feed(eager, 1000, seed=5)
    with lazy.deferred():
        feed(lazy, 1000, seed=5)
        assert not lazy.fitted and lazy.fits == 0
    assert lazy.fits == 1 and lazy.fitted and eager.fits == 8  # refits due at steps 64, 192, ..., 960
    assert lazy.steps_seen == eager.steps_seen
    for a, b in zip(lazy.coefficients.as_tuple(), eager.coefficients.as_tuple(), strict=True):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-12)
    assert lazy.residual_scale == pytest.approx(eager.residual_scale, rel=1e-5)
    feed(lazy, 100, seed=6)  # after the batch: refits when due again, as before
    feed(eager, 100, seed=6)
    assert lazy.coefficients.as_tuple() == pytest.approx(eager.coefficients.as_tuple(), rel=1e-5, abs=1e-12)


def test_deferred_fit_reads_exactly_the_window_at_the_last_refit_due() -> None:
    """The window a deferred batch fits on is the one the model held at the last refit due in it, steps since
    included nowhere, even those the window has pushed out since (a short window: 256 steps, 40 pushed out)."""
    def fit_on(rows: object, kept: object, gaps: object) -> tuple[float, ...]:
        """A fresh model's one fit, from the prior as the batch's only fit starts, on exactly this window: the
        fit is deterministic, so the batch read this window if and only if its coefficients are these, bit for
        bit (the model is called, not spied on: a compiled class cannot be patched)."""
        fresh = StepCostModel(min_steps=64, refit_every=128, max_window=256)
        fresh._fit(cost_model._window(rows, kept), list(gaps))  # type: ignore[arg-type]
        return (*fresh.coefficients.as_tuple(), fresh.coefficients.step_gap_s, fresh.residual_scale)

    lazy, ref = StepCostModel(min_steps=64, refit_every=128, max_window=256), StepCostModel(max_window=256)
    with lazy.deferred():
        feed(lazy, 1000, seed=5)  # refits due at steps 64, 192, ..., 960
    feed(ref, 960, seed=5)
    assert lazy.fits == 1
    read = (*lazy.coefficients.as_tuple(), lazy.coefficients.step_gap_s, lazy.residual_scale)
    assert read == fit_on(ref._rows, ref._kept, ref._gaps)
    assert read != fit_on(lazy._rows, lazy._kept, lazy._gaps)  # the batch's end window: another fit
    assert lazy._rows[0][0] > ref._rows[0][0]  # the batch's end window no longer holds the oldest ones read


def test_a_prefilling_request_costs_beyond_its_tokens_and_both_sizes_are_priced() -> None:
    """A machine where each prefilling request costs 3 ms beyond its tokens (its logits, sampling, input rows):
    fitted on its 32-token prefills, 2,048-token chunks and decode batches, the model prices both prefill sizes
    (one per-token figure cannot: the long chunks set it and the short prefills came out at half their time),
    through the timeline's step records and in the re-simulation's step prices."""
    machine = StepCostPrior(intercept_s=0.001, per_prefill_token_s=3e-5, per_decode_request_s=1e-4,
                            per_decode_context_token_s=1e-7, per_prefill_pair_s=1e-8, step_gap_s=0.001,
                            per_prefill_request_s=3e-3)

    def seconds(f: StepFeatures) -> float:
        return sum(c * v for c, v in zip(machine.as_tuple(), f.row(), strict=True))

    def record(i: int, members: tuple[StepMember, ...]) -> StepRecord:
        f = StepFeatures.from_record(StepRecord(0, i, 0.0, 0.0, 0, 0, 0, 0, 0.0, members))
        return StepRecord(0, i, float(i), seconds(f) * (1 + 0.02 * ((i * 7919) % 11 - 5) / 5), 0, 0, 0, 0, 0.0,
                          members)

    model = StepCostModel(min_steps=64, refit_every=64)
    rng = random.Random(11)
    for i in range(900):
        decoders = tuple(StepMember(f"d{j}", "decode", 1, rng.randint(40, 600), 3) for j in range(rng.randint(1, 4)))
        if i % 10 == 0:
            members = (StepMember(f"s{i}", "prefill", 32, 32, 0), *decoders)
        elif i % 150 == 75:
            done = 2048 * rng.randint(0, 2)
            members = (StepMember(f"w{i}", "prefill", 2048, done + 2048, 0),)
        else:
            members = decoders
        step = record(i, members)
        model.observe_features(StepFeatures.from_record(step), step.elapsed_s)
    model.refit()
    gap = model.coefficients.step_gap_s
    short = StepFeatures(32, 0, 0, prefill_pairs(0, 32), 1)
    chunk = StepFeatures(2048, 0, 0, prefill_pairs(2048, 2048), 1)
    for f in (short, chunk):
        got = model.step_seconds_with_prefill(f.prefill_tokens, 0, 0, f.prefill_pairs, 1) - gap
        assert got == pytest.approx(seconds(f), rel=0.1)
    assert model.solo_ttft_s(32, 2048) - gap == pytest.approx(seconds(short), rel=0.1)
    # the re-simulation prices a step by its members: the short's prefill and a decode, then without the short
    pricer = Pricer(model)
    members = [Member("s", 32, 0, False), Member("d", 1, 300, True)]
    prices = StepPrices(pricer, members)
    saving, _ = prices.marginal(members[0])
    assert saving == pytest.approx(seconds(short) - machine.intercept_s, rel=0.1)


@settings(max_examples=300, deadline=None)
@given(st.integers(1, 6), st.integers(0, 2**32 - 1))
def test_nonnegative_solve_picks_what_trying_every_support_picks(n: int, seed: int) -> None:
    """The optimality test from the largest supports down returns, bit for bit, the support the full search over all
    2^n - 1 would: on positive definite systems (a fit's normal equations plus its prior's penalty) whose
    unconstrained optimum has some, none or all terms negative."""
    from attrib_agent.attribution.cost_model import _best_support, _nonnegative_solve
    rng = random.Random(seed)
    m = [[rng.gauss(0, 1) for _ in range(n)] for _ in range(n + 2)]
    a = [[sum(r[i] * r[j] for r in m) + (0.1 if i == j else 0.0) for j in range(n)] for i in range(n)]
    b = [rng.gauss(rng.choice((-1.0, 0.0, 1.0)), 1) for _ in range(n)]
    x = _nonnegative_solve(a, b)
    assert repr(x) == repr(_best_support(a, b))  # bit for bit: 0.0 and -0.0 apart
    assert all(v >= 0 for v in x)


def test_nonnegative_solve_with_nothing_to_gain_is_all_zeros() -> None:
    from attrib_agent.attribution.cost_model import _best_support, _nonnegative_solve
    a = [[2.0, 0.5], [0.5, 1.0]]
    for b in ([0.0, 0.0], [-0.0, -1.0], [-1.0, -2.0]):
        assert repr(_nonnegative_solve(a, b)) == repr(_best_support(a, b)) == "[0.0, 0.0]"
