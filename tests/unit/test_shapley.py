import pytest

from attrib_agent.attribution.shapley import all_subsets, shapley_values


def test_subsets_smallest_first_and_complete():
    subs = all_subsets(["w1", "w2", "w3"])
    assert len(subs) == 8
    assert subs[0] == frozenset() and subs[-1] == frozenset({"w1", "w2", "w3"})
    assert [len(s) for s in subs] == sorted(len(s) for s in subs)


def test_additive_game_gives_each_its_own_effect():
    phi = shapley_values(["a", "b"], lambda s: 2.0 * ("a" in s) + 5.0 * ("b" in s))
    assert phi == pytest.approx({"a": 2.0, "b": 5.0})


def test_only_the_combination_hurts_splits_evenly():
    # Neither whale alone slows the victim; together they exhaust KV: the fair split is half each.
    values = {frozenset(): 0.0, frozenset({"a"}): 0.0, frozenset({"b"}): 0.0, frozenset({"a", "b"}): 3.0}
    phi = shapley_values(["a", "b"], lambda s: values[s])
    assert phi == pytest.approx({"a": 1.5, "b": 1.5})


def test_efficiency_and_dummy_player():
    values = {}
    for s in all_subsets(["a", "b", "c"]):
        # c is a dummy: never changes anything; a and b interact.
        values[s] = 1.0 * ("a" in s) + 2.0 * ("b" in s) + 4.0 * ({"a", "b"} <= s)
    phi = shapley_values(["a", "b", "c"], lambda s: values[s])
    assert sum(phi.values()) == pytest.approx(values[frozenset({"a", "b", "c"})] - values[frozenset()])
    assert phi["c"] == pytest.approx(0.0)
    assert phi["a"] == pytest.approx(1.0 + 2.0) and phi["b"] == pytest.approx(2.0 + 2.0)


def test_rejects_duplicates():
    with pytest.raises(ValueError):
        shapley_values(["a", "a"], lambda s: 0.0)
