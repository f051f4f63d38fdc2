import pytest

from attrib_agent.lab.summary import Spread, format_table, group_latency, mean_itl_s, percentile, ttft_s


def res(intended, first, tokens, status="ok", whale=False):
    return {"intended_send_ts": intended, "first_token_ts": first, "token_ts": tokens, "status": status,
            "is_whale": whale}


def test_ttft_counts_from_the_intended_send():
    # Sent 40 ms late (client starved) and answered 10 ms after that: TTFT is 50 ms, not 10.
    r = res(100.0, 100.05, [100.05, 100.06])
    r["actual_send_ts"] = 100.04
    assert ttft_s(r) == pytest.approx(0.05)


def test_mean_itl_is_span_over_gaps():
    assert mean_itl_s(res(0, 1.0, [1.0, 1.1, 1.3, 1.6])) == pytest.approx(0.2)
    assert mean_itl_s(res(0, 1.0, [1.0])) is None
    assert ttft_s(res(0, None, [], status="error")) is None


def test_percentile_interpolates():
    assert percentile([1, 2, 3, 4], 50) == pytest.approx(2.5)
    assert percentile([5], 95) == 5
    with pytest.raises(ValueError):
        percentile([], 50)


def test_spread_and_group():
    s = Spread.of([1.0, 2.0, 3.0])
    assert (s.n, s.mean, s.min, s.max) == (3, 2.0, 1.0, 3.0)
    assert s.std == pytest.approx(1.0)
    g = group_latency([res(0, 0.1, [0.1, 0.2]), res(0, 0.3, [0.3, 0.5]), res(0, None, [], status="timeout")])
    assert (g.count, g.ok) == (3, 2)
    assert g.ttft_p50_s == pytest.approx(0.2)
    assert g.itl_mean_s == pytest.approx(0.15)
    assert "2/3" in format_table([("x", g)])
