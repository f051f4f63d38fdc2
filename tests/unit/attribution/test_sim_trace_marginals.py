"""A decode-only step priced by a frozen fit takes `_decode_marginals`: the same floats as the general path."""

from __future__ import annotations

import random

from attrib_agent.attribution.sim_cache import FrozenCost
from attrib_agent.attribution.sim_trace import Member, Pricer, StepPrices, _marginal


def _frozen(rng: random.Random) -> FrozenCost:
    # signs and scales vary: a negative term can push a step under the floor, where the max() branch matters
    a, b, c, d, e, f = (rng.choice((1, -1)) * rng.uniform(0, s) for s in (5e-3, 1e-6, 2e-4, 2e-8, 1e-9, 1e-4))
    return FrozenCost(a, b, c, d, e, rng.uniform(0, 2e-3), f, rng.choice((1e-12, 1e-3)))


def test_decode_marginals_are_the_general_paths_bit_for_bit() -> None:
    rng = random.Random(7)
    fast = 0
    for _ in range(2000):
        cost = _frozen(rng)
        members = [Member(f"r{i}", 1, rng.randrange(0, 9000), True) for i in range(rng.randrange(1, 40))]
        if rng.random() < 0.2:  # a prefill among them: the general path
            members.insert(rng.randrange(len(members) + 1), Member("p", rng.randrange(1, 512), 0, False))
        pricer = Pricer(cost)
        prices = StepPrices(pricer, members)
        general = [_marginal(m, pricer.price5, prices.total, prices.full) for m in members]
        assert prices.marginals() == general
        fast += prices.total[4] == 0
    assert fast > 1000  # most took the fast path


class _SamePrices:
    """A cost with a frozen fit's prices that is not a FrozenCost (a subclass where the build allows one)."""

    def __init__(self, frozen: FrozenCost) -> None:
        self.step_seconds = frozen.step_seconds
        self.step_seconds_with_prefill = frozen.step_seconds_with_prefill


def test_only_a_frozen_fit_takes_the_fast_path() -> None:
    cost = FrozenCost(1e-3, 0.0, 1e-4, 1e-8, 0.0, 0.0)
    assert Pricer(cost).frozen is cost
    assert Pricer(_SamePrices(cost)).frozen is None
    try:
        sub = type("Subclass", (FrozenCost,), {})(1e-3, 0.0, 1e-4, 1e-8, 0.0, 0.0)
    except TypeError:  # compiled by mypyc (the opt-in build): no interpreted class can subclass it
        return
    assert Pricer(sub).frozen is None


def test_a_members_solo_price_is_the_one_member_steps() -> None:
    rng = random.Random(11)
    for _ in range(2000):
        pricer = Pricer(_frozen(rng))
        decode = rng.random() < 0.5
        m = Member("m", 1 if decode else rng.randrange(1, 2048), rng.randrange(0, 9000), decode)
        assert pricer.solo(m) == pricer.seconds([m])
