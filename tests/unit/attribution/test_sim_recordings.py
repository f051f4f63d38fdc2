"""The re-simulation checked on real vLLM 0.32 recordings: replaying with nobody removed must reproduce the
observed waits and preemptions, and removing whales must move the shorts' TTFT as the lab's counterfactual
truth measured. Numbers are printed (pytest -s) for the report."""

from __future__ import annotations

import json
import statistics
from pathlib import Path

import pytest

from attrib_agent.attribution.scheduler_sim import simulate, slowdown_shares
from attrib_agent.attribution.sim_types import SimRequest
from attrib_agent.events import RequestAdded
from attrib_agent.sources.replay import ReplaySource

from .recorded import RECORDINGS, Recorded, fitted_cost, load, step_features

TRUTH = Path(__file__).resolve().parents[2] / "fixtures" / "truth" / "whale2" / "truth.json"
OBSERVED_PREEMPTIONS = {"shorts": 0, "whale1": 0, "whale2": 2, "preempt": 1}


def p90(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[round(0.9 * (len(ordered) - 1))]


def added_arrivals(rec: Recorded) -> list[SimRequest]:
    """Arrival = the `Added request` log time: after the frontend's processing (a long prompt takes longer)."""
    added = {e.request_id: e.log_ts for e in ReplaySource(RECORDINGS / rec.name).events()
             if isinstance(e, RequestAdded) and e.log_ts is not None}
    return [SimRequest(r.request_id, max(r.arrival_ts, added.get(r.request_id, r.arrival_ts)), r.prompt_tokens,
                       r.output_tokens) for r in rec.requests]


def replay_errors(rec: Recorded, requests: list[SimRequest]) -> dict[str, dict[str, list[float]]]:
    """Absolute errors (ms) of simulated vs vLLM's own queue time and TTFT, for shorts and whales."""
    res = simulate(requests, rec.config, fitted_cost(rec))
    out: dict[str, dict[str, list[float]]] = {"short": {"queue": [], "ttft": []}, "whale": {"queue": [], "ttft": []}}
    for span in rec.spans:
        o = res.outcomes[span.request_id]
        assert o.scheduled_ts is not None and o.queued_ts is not None and o.first_token_ts is not None
        assert span.queue_s is not None and span.ttft_s is not None
        group = out["whale" if rec.is_whale(span.request_id) else "short"]
        group["queue"].append(abs((o.scheduled_ts - o.queued_ts) - span.queue_s) * 1000)
        group["ttft"].append(abs((o.first_token_ts - span.start_ts) - span.ttft_s) * 1000)
    out["run"] = {"preemptions": [float(res.preemptions)], "steps": [float(res.steps)]}
    return out


@pytest.mark.parametrize("name", ["shorts", "whale1", "whale2", "preempt"])
def test_cost_model_fits_the_logged_steps(name: str) -> None:
    rec = load(name)
    cost = fitted_cost(rec)
    c = cost.coefficients
    chunks = [(f, el) for f, el, _ in step_features(rec) if f.prefill_tokens >= 1000]
    rel = [abs(cost.step_seconds_with_prefill(f.prefill_tokens, f.decode_requests, f.decode_context_sum,
                                              f.prefill_pairs, f.prefill_requests) - c.step_gap_s - el) / el
           for f, el in chunks]
    scale = cost.residual_scale
    assert cost.fitted and scale is not None
    print(f"\n{name}: a={c.intercept_s * 1e3:.2f}ms b={c.per_prefill_token_s * 1e6:.1f}us/tok "
          f"c={c.per_decode_request_s * 1e3:.2f}ms/req d={c.per_decode_context_token_s * 1e9:.0f}ns/ctx-tok "
          f"e={c.per_prefill_pair_s * 1e9:.1f}ns/pair f={c.per_prefill_request_s * 1e3:.2f}ms/prefilling req "
          f"gap={c.step_gap_s * 1e3:.2f}ms; residual scale "
          f"{scale * 1e3:.2f}ms; big prefill steps {len(rel)}, median rel err "
          f"{statistics.median(rel) if rel else float('nan'):.1%}")
    assert scale < 0.005
    assert not rel or statistics.median(rel) < 0.2


@pytest.mark.parametrize("name", ["shorts", "whale1", "whale2", "preempt"])
def test_replay_with_nobody_removed_reproduces_the_observed_waits(name: str) -> None:
    rec = load(name)
    for label, requests in (("span start", rec.requests), ("Added log", added_arrivals(rec))):
        errors = replay_errors(rec, requests)
        run = errors.pop("run")
        print(f"\n{name} [{label} arrivals]: preemptions sim {run['preemptions'][0]:.0f} / observed "
              f"{rec.preemptions}; steps sim {run['steps'][0]:.0f} / logged {len(rec.steps)}")
        for group, e in errors.items():
            if e["ttft"]:
                print(f"  {group:5} n={len(e['ttft']):2}  queue |err| median {statistics.median(e['queue']):6.1f} "
                      f"p90 {p90(e['queue']):6.1f} ms   TTFT |err| median {statistics.median(e['ttft']):6.1f} "
                      f"p90 {p90(e['ttft']):6.1f} ms")
        assert run["preemptions"][0] == OBSERVED_PREEMPTIONS[name] == rec.preemptions
        assert run["steps"][0] == len(rec.steps)  # exact, as docs/attribution.md says (640/403/697/932 measured)
        # Errors relative to the TTFT (floored at 250 ms): a few ms on quick shorts, a few % on shorts that
        # waited seconds behind the whales (the simulated decode runs ~3% fast in `preempt`).
        observed = [(s.ttft_s or 0.0) * 1e3 for s in rec.spans if not rec.is_whale(s.request_id)]
        relative = [e / max(o, 250.0) for e, o in zip(errors["short"]["ttft"], observed, strict=True)]
        assert statistics.median(relative) < 0.1 and p90(relative) < 0.5
        assert p90(errors["short"]["ttft"]) < 250
        assert all(err < 100 for err in errors["whale"]["ttft"])


def test_removing_whales_moves_the_shorts_like_the_counterfactual_truth() -> None:
    rec, truth = load("whale2"), json.loads(TRUTH.read_text())
    cost = fitted_cost(rec)
    requests = added_arrivals(rec)
    whales = {rec.spec_id(r.request_id): r.request_id for r in requests if rec.is_whale(r.request_id)}
    conditions = ("w1", "w2", "w1+w2")
    errors: dict[str, list[float]] = {c: [] for c in conditions}
    sim_total = dict.fromkeys(conditions, 0.0)
    truth_total = dict.fromkeys(conditions, 0.0)
    interaction: list[tuple[str, dict[str, float]]] = []
    print("\nshort  " + "  ".join(f"{c:>5}: truth   sim" for c in conditions) + "   (TTFT slowdown, ms)")
    for r in requests:
        spec = rec.spec_id(r.request_id)
        if rec.is_whale(r.request_id) or spec not in truth["shorts"]:
            continue
        shares, runs = slowdown_shares(requests, rec.config, cost, r.request_id,
                                       {w: [rid] for w, rid in whales.items()})
        sim = {"w1": runs[frozenset({"w1"})], "w2": runs[frozenset({"w2"})], "w1+w2": runs[frozenset(whales)]}
        real = truth["shorts"][spec]["slowdown"]["ttft_s"]
        for c in conditions:
            errors[c].append(abs(sim[c] - real[c]) * 1000)
            sim_total[c] += sim[c]
            truth_total[c] += real[c]
        if sim["w1+w2"] > 0.2 and max(sim["w1"], sim["w2"]) < 0.05:
            interaction.append((spec, shares))
        print(f"{spec:5}  " + "  ".join(f"{real[c] * 1000:11.0f} {sim[c] * 1000:5.0f}" for c in conditions))
    for c in conditions:
        print(f"{c:6} |sim - truth| median {statistics.median(errors[c]):6.1f} ms, p90 {p90(errors[c]):6.1f} ms; "
              f"summed over shorts: sim {sim_total[c] * 1000:6.0f} ms, truth {truth_total[c] * 1000:6.0f} ms")
    print(f"interaction victims (only both whales together hurt): {interaction}")
    for c in ("w1", "w2"):  # one whale: prefill contention and a busier decode, nothing chaotic
        assert statistics.median(errors[c]) < 15 and p90(errors[c]) < 60
    assert statistics.median(errors["w1+w2"]) < 30
    # The whale-holds-KV, other-whale-blocks-admission interaction shows up, split about evenly as in the truth.
    assert interaction
    for _, shares in interaction:
        assert min(shares.values()) > 0.3 * sum(shares.values())


def test_trace_explains_a_short_stuck_behind_a_readmitted_whale() -> None:
    rec = load("whale2")
    cost = fitted_cost(rec)
    victim = next(r for r in rec.requests if rec.spec_id(r.request_id) == "s017")
    res = simulate(rec.requests, rec.config, cost, trace=victim.request_id)
    o = res.outcomes[victim.request_id]
    assert o.first_token_ts is not None and o.preemptions == 0
    ttft_waits = [w for w in o.waits if w.ts is not None and w.ts < o.first_token_ts]
    by_cause: dict[str, float] = {}
    for w in ttft_waits:
        by_cause[w.cause] = by_cause.get(w.cause, 0.0) + w.seconds
    print(f"\nwhale2 s017 TTFT {o.ttft_s(victim.arrival_ts):.3f}s: " +
          ", ".join(f"{k} {v * 1000:.0f}ms" for k, v in sorted(by_cause.items())))
    # Queued behind the preempted short s016, then behind the preempted whale w2 that did not fit.
    blamed = {rid for w in ttft_waits if w.cause == "head_of_line" for rid, _ in w.by_request}
    assert {rec.spec_id(rid) for rid in blamed} >= {"w2"}
    assert by_cause["head_of_line"] > 0.2
    ttft = o.ttft_s(victim.arrival_ts)
    assert ttft == pytest.approx(cost.solo_ttft_s(victim.prompt_tokens, rec.config.token_budget)
                                 + sum(w.seconds for w in ttft_waits))
