"""`lab score`'s resolved columns: a whale's true summed share, its standard error from the truth's own reps, and
whether the truth tells it from none; an unresolved whale blamed within that noise agrees within noise."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from attrib_agent.lab.score import Score, engine_blame, engine_itl_blame, format_scores, score_truth

TRUTH = Path(__file__).parents[2] / "fixtures" / "truth"


def spread(mean: float, std: float, n: int) -> dict[str, float]:
    return {"mean": mean, "std": std, "n": n, "min": mean - std, "max": mean + std}


def tiny_truth(tmp_path: Path) -> Path:
    """Two whales, two shorts, the four conditions. Short a: TTFT means none 0.10, w1 0.20, w2 0.10, both 0.30 s;
    stds 0.02 / 0.04 / 0.02 / 0.04 over 4 reps. Short b: 0.10 / 0.10 / 0.10 / 0.08, stds 0.05 over 2 reps. With two
    whales phi_w1 = (m_w1 - m_none + m_both - m_w2) / 2, so each mean's weight is +-1/2: a 0.15, b -0.01 (w1);
    a 0.05, b -0.01 (w2). Var of each: (1/4) sum std**2 / n: a (0.0004 + 0.0016 + 0.0004 + 0.0016) / 4 / 4
    = 0.00025, b 4 x 0.0025 / 2 / 4 = 0.00125; the sum's SE sqrt(0.0015) = 0.03873 for both whales. Short a's mean
    ITL has the same spreads (SE sqrt(0.00025) = 0.01581); short b has no ITL figure."""
    a = {"none": (0.10, 0.02), "w1": (0.20, 0.04), "w2": (0.10, 0.02), "w1+w2": (0.30, 0.04)}
    b = {"none": (0.10, 0.05), "w1": (0.10, 0.05), "w2": (0.10, 0.05), "w1+w2": (0.08, 0.05)}
    shorts: dict[str, Any] = {
        "a": {"conditions": {c: {"ttft_s": spread(m, s, 4), "mean_itl_s": spread(m, s, 4)} for c, (m, s) in a.items()},
              "shapley": {"ttft_s": {"w1": 0.15, "w2": 0.05}, "mean_itl_s": {"w1": 0.15, "w2": 0.05}}},
        "b": {"conditions": {c: {"ttft_s": spread(m, s, 2)} for c, (m, s) in b.items()},
              "shapley": {"ttft_s": {"w1": -0.01, "w2": -0.01}}},
    }
    runs = [{"accepted": True, "condition": c, "recording": f"runs/{c}-r{r}"}
            for c in ("none", "w1+w2") for r in (0, 1)]
    truth = {"conditions": ["none", "w1", "w2", "w1+w2"], "whales": {"w1": {}, "w2": {}}, "shorts": shorts,
             "runs": runs}
    (tmp_path / "truth.json").write_text(json.dumps(truth))
    return tmp_path


def blamer(on_w2: float) -> Any:
    """Blame short a on w1 0.16 s and on w2 `on_w2` in every all-whale run; nothing in the null runs."""
    return lambda path: {} if path.name.startswith("none") else {"a": {"w1": 0.16, "w2": on_w2}}


def test_the_standard_error_is_the_hand_computation_and_resolves_w1_not_w2(tmp_path: Path) -> None:
    s = score_truth(tiny_truth(tmp_path), "t", blamer(0.0), blamer(0.0))
    w1, w2 = s.whales["w1"], s.whales["w2"]
    assert math.isclose(w1.se_s, math.sqrt(0.0015)) and math.isclose(w2.se_s, math.sqrt(0.0015))
    assert (w1.true_s, w2.true_s) == (0.15, 0.05)  # clipped, as the error has always used
    assert math.isclose(w1.net_s, 0.14) and math.isclose(w2.net_s, 0.04)
    assert w1.resolved and not w2.resolved  # 0.14 >= 2 x 0.0387 > 0.04
    # The printed errors are as before; the resolved median leaves out w2, whose 0 blame is within 2 SE of 0.04.
    assert s.whale_rel_errors == {"w1": abs(0.16 - 0.15) / 0.15, "w2": 1.0}
    assert math.isclose(s.median_whale_error_resolved or 0.0, 0.16 / 0.15 - 1)
    d = s.as_dict()
    assert d["resolved_whales"] == ["w1"] and d["agrees_within_noise"] == ["w2"]
    # ITL: short a alone, SE sqrt(0.00025) = 0.0158; w1 (0.15) and w2 (0.05) are both over 2 SE: resolved.
    i1, i2 = s.itl_whales["w1"], s.itl_whales["w2"]
    assert math.isclose(i1.se_s, math.sqrt(0.00025)) and i1.resolved and i2.resolved
    assert d["itl_resolved_whales"] == ["w1", "w2"] and d["itl_agrees_within_noise"] == []


def test_an_unresolved_whale_blamed_beyond_the_noise_is_an_error_as_before(tmp_path: Path) -> None:
    """w2 blamed 0.20 s: 0.16 from its net share, over 2 SE (0.077); unresolved, so outside the resolved median,
    and not counted as agreeing."""
    s = score_truth(tiny_truth(tmp_path), "t", blamer(0.20))
    assert not s.whales["w2"].resolved and not s.whales["w2"].within_noise
    assert math.isclose(s.whale_rel_errors["w2"], 3.0)
    assert s.as_dict()["agrees_within_noise"] == [] and s.itl_whales == {}
    assert "0/1" in format_scores([s]).splitlines()[1]  # of the one unresolved whale, none agrees


def test_continuous_b1024s_whales_are_unresolved_and_their_zero_blame_agrees_within_noise() -> None:
    """The held-out continuous-b1024 (truth14): clipped shares 27 and 3 ms summed over 40 shorts read 100 % errors
    against the agent's 0 blame. Net, the shares are +5 ms (w1) and -79 ms (w2), each +-12 ms: no harm the truth
    resolves, and 0 blame is within its noise; the same for mean ITL. The printed errors are unchanged."""
    s = score_truth(TRUTH / "continuous-b1024", "attrib-agent", engine_blame, engine_itl_blame)
    assert s.whale_rel_errors == {"w1": 1.0, "w2": 1.0} and s.itl_whale_rel_errors == {"w1": 1.0, "w2": 1.0}
    w1, w2 = s.whales["w1"], s.whales["w2"]
    assert math.isclose(w1.true_s, 0.027, abs_tol=0.001) and math.isclose(w1.net_s, 0.005, abs_tol=0.001)
    assert math.isclose(w2.net_s, -0.079, abs_tol=0.001)
    assert math.isclose(w1.se_s, 0.012, abs_tol=0.001) and w1.blamed_s == w2.blamed_s == 0.0
    for whales in (s.whales, s.itl_whales):
        assert all(not t.resolved and t.within_noise for t in whales.values())
    assert s.median_whale_error_resolved is None and s.median_itl_whale_error_resolved is None
    d = s.as_dict()
    assert d["agrees_within_noise"] == d["itl_agrees_within_noise"] == ["w1", "w2"]


def test_preempts_resolved_whales_score_as_before() -> None:
    """preempt's three whales are each 30 SE from none: all resolved, the resolved median the median (0 %), no whale
    left to noise."""
    s: Score = score_truth(TRUTH / "preempt", "attrib-agent", engine_blame, engine_itl_blame)
    assert all(t.resolved and t.net_s > 25 * t.se_s for t in s.whales.values())
    assert s.median_whale_error_resolved == s.median_whale_error and s.median_whale_error is not None
    assert s.median_whale_error < 0.01
    assert s.median_itl_whale_error_resolved == s.median_itl_whale_error
    assert s.as_dict()["resolved_whales"] == ["w1", "w2", "w3"] and s.as_dict()["agrees_within_noise"] == []
