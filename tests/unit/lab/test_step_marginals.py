"""The cause truth splits a step among its members by what each added to it (lab/step_marginals.py)."""

import random

import pytest

from attrib_agent.lab import cause_truth, step_marginals
from attrib_agent.lab.step_marginals import StepMarginals
from attrib_agent.timeline.model import RequestLifecycle

PRICES = StepMarginals(intercept_s=0.010, per_decode_s=0.0005, per_prefill_token_s=1e-4, per_prefill_request_s=0.002)


def _step(t, scheduled, it=None):
    return {"v": 1, "kind": "step", "t": t, "iter": it, "blocks": {}, "head": None, "preempted": [],
            "scheduled": [{"id": f"{r}-0abc1234", "new": n, "done": d} for r, (n, d) in scheduled.items()]}


def test_the_fit_finds_the_prices_the_steps_were_made_with_and_leaves_busy_steps_out():
    rng = random.Random(3)
    steps, t = [], 0.0
    for k in range(400):
        decodes = rng.randint(1, 8)
        chunk = rng.choice([0, 0, 0, 64, 512, 1024])
        sched = {f"d{i}": (1, rng.randint(10, 2000)) for i in range(decodes)}
        if chunk:
            sched["p"] = (chunk, 0)
        steps.append(_step(t, sched, k))
        cost = (PRICES.intercept_s + PRICES.per_decode_s * decodes
                + (PRICES.per_prefill_request_s + PRICES.per_prefill_token_s * chunk if chunk else 0.0))
        t += cost * (5.0 if k % 50 == 7 else rng.uniform(0.98, 1.02))  # a few steps the machine was busy for
    f = step_marginals.fit(steps)
    assert f.per_decode_s == pytest.approx(PRICES.per_decode_s, rel=0.15)
    assert f.per_prefill_token_s == pytest.approx(PRICES.per_prefill_token_s, rel=0.05)
    assert f.intercept_s == pytest.approx(PRICES.intercept_s, rel=0.1)
    assert f.per_decode_context_token_s < 1e-6
    assert f.steps <= 400 - 7


def test_too_few_steps_give_no_fit():
    assert step_marginals.fit([_step(0.1 * k, {"a": (1, 10)}) for k in range(5)]).steps == 0


def test_a_decoding_neighbour_is_labelled_by_what_it_added_not_the_whole_step():
    """v decodes beside w's 1,024-token chunk and u's decode for one step, then beside u's for two more (the last
    step, at 0.4 s, ends the victim's life): the whole-step rule labels u's time 3x w's (0.3 s decode against
    0.1 s); by what each added, w's chunk (0.1044 s of a 0.1154 s step) far outweighs u's decodes (0.5 ms a step)."""
    lc = RequestLifecycle("v", arrival_ts=0.0, first_token_ts=0.05, finish_ts=0.5)
    steps = [_step(0.0, {"v": (32, 0)}), _step(0.1, {"v": (1, 32), "w": (1024, 0), "u": (1, 50)}),
             _step(0.2, {"v": (1, 33), "u": (1, 51)}), _step(0.3, {"v": (1, 34), "u": (1, 52)}),
             _step(0.4, {"v": (1, 35), "u": (1, 53)})]
    whole, _ = cause_truth.truth_labels("v", lc, steps)
    assert dict(whole["itl"]["u"]) == pytest.approx({"decode": 0.3})
    assert dict(whole["itl"]["w"]) == pytest.approx({"prefill_contention": 0.1})
    priced, _ = cause_truth.truth_labels("v", lc, steps, PRICES)
    chunk_step = 0.010 + 0.0005 * 2 + 0.002 + 0.1024
    assert dict(priced["itl"]["w"]) == pytest.approx({"prefill_contention": 0.1 * 0.1044 / chunk_step})
    assert priced["itl"]["u"]["decode"] == pytest.approx(0.1 * 0.0005 / chunk_step + 0.2 * 0.0005 / 0.011)
    assert priced["itl"]["w"]["prefill_contention"] > 4 * priced["itl"]["u"]["decode"]


def test_a_victim_waiting_on_the_budget_loses_the_whole_step_split_by_what_each_added():
    lc = RequestLifecycle("v", arrival_ts=0.0, first_token_ts=0.25, finish_ts=0.3)
    steps = [_step(0.0, {"w": (2000, 0), "u": (1, 10)}), _step(0.2, {"v": (32, 0), "u": (1, 11)}),
             _step(0.25, {"v": (1, 32), "u": (1, 12)})]
    labels, _ = cause_truth.truth_labels("v", lc, steps, PRICES)
    w, u = labels["ttft"]["w"]["prefill_contention"], labels["ttft"]["u"]["decode"]
    assert w + u == pytest.approx(0.2 + 0.05 * 0.0005 / (0.010 + 0.0005 + 0.002 + 0.0032))
    assert w / (u - 0.05 * 0.0005 / 0.0157) == pytest.approx((0.002 + 0.2) / 0.0005)
