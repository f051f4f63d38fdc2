"""Exact Shapley values over a small set of players (whales), from a value for every subset.

v(S) is a victim's slowdown when only the whales in S run beside it: measured by the lab's
counterfactual runs (the truth) and re-simulated by the attribution engine. The Shapley share is the
fair split of v(all) when only a combination of whales causes the delay.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
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
