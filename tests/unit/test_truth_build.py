import pytest

from attrib_agent.lab.truth import build_truth
from attrib_agent.lab.workload import get_scenario


def test_truth_holds_spreads_slowdowns_and_shapley_that_adds_up():
    sc = get_scenario("whale2")
    obs = {}
    for spec in sc.shorts:
        obs[spec.spec_id] = {
            "none": {"ttft_s": [0.02, 0.03], "mean_itl_s": [0.007, 0.008]},
            "w1": {"ttft_s": [1.0, 1.2], "mean_itl_s": [0.012, 0.013]},
            "w2": {"ttft_s": [0.5, 0.7], "mean_itl_s": [0.010, 0.010]},
            "w1+w2": {"ttft_s": [2.5, 2.9], "mean_itl_s": [0.015, 0.016]},
        }
    t = build_truth(sc, 2, obs, runs=[])
    assert t["format"] == "attrib-truth" and t["version"] == 1
    assert t["conditions"] == ["none", "w1", "w2", "w1+w2"]
    s = t["shorts"]["s000"]
    assert s["conditions"]["w1"]["ttft_s"]["mean"] == pytest.approx(1.1)
    assert s["conditions"]["w1"]["ttft_s"]["n"] == 2 and s["conditions"]["w1"]["ttft_s"]["std"] > 0
    all_slow = s["slowdown"]["ttft_s"]["w1+w2"]
    assert all_slow == pytest.approx(2.7 - 0.025)
    phi = s["shapley"]["ttft_s"]
    assert phi["w1"] + phi["w2"] == pytest.approx(all_slow)
    # w1 alone hurts more than w2 alone, and the interaction is split evenly.
    assert phi["w1"] > phi["w2"]


def test_short_missing_a_condition_gets_no_split():
    sc = get_scenario("whale1")
    obs = {"s000": {"none": {"ttft_s": [0.02]}}}
    t = build_truth(sc, 1, obs, runs=[])
    assert t["shorts"]["s000"]["shapley"] == {}
