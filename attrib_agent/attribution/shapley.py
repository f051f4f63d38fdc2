"""Exact Shapley values over a small set of players (whales), from a value for every subset.

v(S) is a victim's slowdown when only the whales in S run beside it: measured by the lab's
counterfactual runs (the truth) and re-simulated by the attribution engine. The Shapley share is the
fair split of v(all) when only a combination of whales causes the delay.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from itertools import combinations
from math import factorial


def all_subsets(players: Sequence[str]) -> list[frozenset[str]]:
    """Every subset, smallest first; the order the truth runs use."""
    return [frozenset(c) for k in range(len(players) + 1) for c in combinations(players, k)]


def shapley_values(players: Sequence[str], value: Callable[[frozenset[str]], float]) -> dict[str, float]:
    """phi_i = sum over S not containing i of |S|!(n-|S|-1)!/n! * (v(S+i) - v(S)).

    Exact enumeration: fine for the handful of whales a lab scenario has (2^n subsets).
    """
    if len(set(players)) != len(players):
        raise ValueError("players must be distinct")
    n = len(players)
    if n > 12:
        raise ValueError("exact Shapley over more than 12 players is too costly")
    cache: dict[frozenset[str], float] = {}

    def v(s: frozenset[str]) -> float:
        if s not in cache:
            cache[s] = value(s)
        return cache[s]

    out: dict[str, float] = {}
    for p in players:
        others = [q for q in players if q != p]
        total = 0.0
        for k in range(len(others) + 1):
            weight = factorial(k) * factorial(n - k - 1) / factorial(n)
            for combo in combinations(others, k):
                s = frozenset(combo)
                total += weight * (v(s | {p}) - v(s))
        out[p] = total
    return out






def largest_effects(players: Sequence[str], value: Callable[[frozenset[str]], float]) -> dict[str, float]:
    """Each player's largest marginal contribution |v(S+w) - v(S)| over the coalitions S (every one: exact, for
    the few players a period has): near 0 when no world shows the player to matter."""
    if len(players) > 12:
        raise ValueError("exact effects over more than 12 players are too costly")
    effect = dict.fromkeys(players, 0.0)
    for s in all_subsets(players):
        for w in players:
            if w not in s:
                effect[w] = max(effect[w], abs(value(s | {w}) - value(s)))
    return effect

def with_shortfall(phi: Mapping[str, float], parts: Mapping[str, float]) -> dict[str, float]:
    """Shapley values of the simulated game plus each player's part of the shortfall D (observed minus simulated,
    in the world that happened): `even_split`'s, or `split_by`'s where no world shows anyone to matter. A player
    without a part gets none of D, and what the parts leave of it goes to nobody (the caller reports it as
    unexplained)."""
    return {p: v + parts.get(p, 0.0) for p, v in phi.items()}


def even_split(shortfall: float, relevant: Collection[str]) -> dict[str, float]:
    """D as a unanimity game of the relevant players R (worth D to a coalition holding all of R): D / |R| to each.

    A player the counterfactual worlds show to be irrelevant gets none of it, so a long but cheap request beside a
    real whale is not blamed for what the simulation misses of the whale; among the relevant ones the split is
    even, not by the simulated sizes, which drift where KV exhaustion is knife-edge (docs/attribution.md). With R
    empty, no part: D goes to nobody."""
    share = shortfall / len(relevant) if relevant else 0.0
    return dict.fromkeys(relevant, share)


def split_by(shortfall: float, fractions: Mapping[str, float]) -> dict[str, float]:
    """D by fractions f_w (the whales' parts of the victim's observed wait, causes.VictimCauses.shares): D x f_w
    each, and D x (1 - sum f) to nobody."""
    return {p: shortfall * f for p, f in fractions.items()}
