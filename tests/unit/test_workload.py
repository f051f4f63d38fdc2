import pytest

from attrib_agent.lab.workload import SCENARIOS, SISO, get_scenario, poisson, prompt_token_ids, scripted


def test_every_scenario_has_unique_ids_and_sorted_arrivals():
    for s in SCENARIOS.values():
        ids = [r.spec_id for r in s.requests]
        assert len(ids) == len(set(ids)), s.name
        offsets = [r.offset_s for r in s.requests]
        assert offsets == sorted(offsets), s.name
        assert s.shorts, s.name


def test_required_scenarios_exist():
    assert not get_scenario("shorts").whales
    assert len(get_scenario("whale1").whales) == 1
    w = get_scenario("whale2").whales
    assert len(w) == 2 and w[0].klass.prompt_tokens != w[1].klass.prompt_tokens
    assert len(get_scenario("preempt").whales) >= 3


def test_with_whales_keeps_the_short_schedule_identical():
    s = get_scenario("whale2")
    for keep in ((), ("w1",), ("w2",), ("w1", "w2")):
        v = s.with_whales(keep)
        assert v.shorts == s.shorts
        assert sorted(w.spec_id for w in v.whales) == sorted(keep)
    with pytest.raises(ValueError, match="no whale"):
        s.with_whales(["w9"])


def test_unknown_scenario_is_a_clear_error():
    with pytest.raises(ValueError, match="known: "):
        get_scenario("nope")


def test_poisson_is_seeded_and_increasing():
    a = poisson("p", [(SISO, 1.0)], 3.0, 50, seed=1)
    b = poisson("p", [(SISO, 1.0)], 3.0, 50, seed=1)
    c = poisson("p", [(SISO, 1.0)], 3.0, 50, seed=2)
    assert a == b and a != c
    assert all(x.offset_s < y.offset_s for x, y in zip(a, a[1:], strict=False))
    # mean gap close to 1/rate
    assert 0.15 < a[-1].offset_s / 50 < 0.6
    with pytest.raises(ValueError):
        poisson("p", [(SISO, 1.0)], 0.0, 1, seed=1)


def test_scripted_spacing():
    r = scripted("s", SISO, 1.0, 0.5, 3)
    assert [x.offset_s for x in r] == [1.0, 1.5, 2.0]
    assert [x.spec_id for x in r] == ["s000", "s001", "s002"]


def test_prompt_ids_deterministic_distinct_and_in_range():
    a, b = prompt_token_ids(64, seed=1), prompt_token_ids(64, seed=2)
    assert a == prompt_token_ids(64, seed=1) and a != b
    assert len(a) == 64 and all(100 <= t < 8000 for t in a)


def test_shared_prefix_plans_share_segments_within_a_run_only():
    from attrib_agent.lab.record import make_plan

    sc = get_scenario("prefix")
    plan = make_plan(sc, "run1", "canary")
    assert all(len(p.prompt_token_ids) == r.klass.prompt_tokens for p, r in zip(plan, sc.requests, strict=True))
    by_doc = {}
    for p, r in zip(plan, sc.requests, strict=True):
        if not r.is_whale:
            by_doc.setdefault(r.prefix, []).append(p.prompt_token_ids)
    assert len(by_doc) == 3
    for segs, prompts in by_doc.items():
        n = sum(k for _, k in segs)
        assert len({tuple(x[:n]) for x in prompts}) == 1 and len({tuple(x[n:]) for x in prompts}) == len(prompts)
    system = {tuple(p.prompt_token_ids[:256]) for p in plan}
    assert len(system) == 1  # the whale shares the system prompt too
    again = make_plan(sc, "run2", "canary")
    assert again[0].prompt_token_ids[:256] != plan[0].prompt_token_ids[:256]  # every run starts with a cold cache
