"""An n>1 request's one result (`client_result`) and its one KV footprint (`client_uses`): the rules written once."""

from __future__ import annotations

import math

from attrib_agent.attribution.result import AttributionResult, Culprit, client_result
from attrib_agent.attribution.whales import KvUse, client_uses, footprints, whales


def child(i: int, ttft: float, itl: float, tokens: int, blame: dict[str, tuple[float, float]],
          final: bool = True) -> AttributionResult:
    """A child's result whose parts add up (sum of culprits + unexplained = slowdown)."""
    culprits = tuple(Culprit(c, t, s, 0.5, {"prefill_contention": t}, kv_block_seconds=float(i + 1),
                             itl_causes={"decode_batching": s}) for c, (t, s) in blame.items())
    ttft_slow, itl_slow = ttft - 0.01, itl - 0.002
    return AttributionResult(
        request_id=f"{i}_cmpl-x-0", finished_ts=10.0 + i, ttft_s=ttft, ttft_baseline_s=0.01, ttft_slowdown_s=ttft_slow,
        itl_s=itl, itl_baseline_s=0.002, itl_slowdown_s=itl_slow, culprits=culprits,
        unexplained_ttft_s=ttft_slow - sum(t for t, _ in blame.values()),
        unexplained_itl_s=itl_slow - sum(s for _, s in blame.values()), no_interference=False, quality=0.9 - i / 10,
        arrival_ts=1.0, prompt_tokens=256, completion_tokens=tokens, trace_id=f"{i:032x}", span_id=f"{i:016x}",
        final=final, preempted_s=0.1 * i)


def test_ttft_is_the_first_childs_itl_per_gap_over_all_tokens_summed() -> None:
    parts = [child(0, 0.05, 0.004, 11, {"cmpl-w-0": (0.02, 0.001)}),
             child(1, 0.03, 0.003, 21, {"cmpl-w-0": (0.01, 0.0005), "cmpl-s-0": (0.0, 0.0002)}),
             child(2, 0.04, 0.006, 1, {})]  # one token: no gap, no weight in ITL
    r = client_result("cmpl-x-0", parts, final=True)
    assert r.request_id == "cmpl-x-0" and r.final and r.completion_tokens == 33
    # each child's tokens - 1 gaps (10 + 20 + 0), as vLLM's ITL histogram pools them; before, 33 - 1 = 32
    assert r.sequences == 3 and r.itl_gaps == 30
    assert math.isclose(r.victim_seconds(), r.ttft_slowdown_s + 30 * r.itl_slowdown_s)
    assert (r.ttft_s, r.ttft_slowdown_s, r.trace_id) == (0.03, parts[1].ttft_slowdown_s, parts[1].trace_id)
    assert math.isclose(r.itl_s or 0.0, (0.004 * 10 + 0.003 * 20) / 30)
    assert r.finished_ts == 12.0 and math.isclose(r.preempted_s, 0.3) and r.quality == parts[2].quality
    w, s = r.culprit("cmpl-w-0"), r.culprit("cmpl-s-0")
    assert w is not None and s is not None
    assert w.ttft_s == 0.01 and math.isclose(w.itl_s, (0.001 * 10 + 0.0005 * 20) / 30)  # TTFT: the first child's
    assert s.ttft_s == 0.0 and math.isclose(s.itl_s, 0.0002 * 20 / 30) and w.kv_block_seconds == 2.0
    assert math.isclose(w.share + s.share, 1.0)
    assert math.isclose(w.share, w.seconds(30) / (w.seconds(30) + s.seconds(30)))  # shares by the 30 gaps
    # the parts still add up
    assert math.isclose(sum(c.ttft_s for c in r.culprits) + r.unexplained_ttft_s, r.ttft_slowdown_s)
    assert math.isclose(sum(c.itl_s for c in r.culprits) + r.unexplained_itl_s, r.itl_slowdown_s)


def test_final_only_as_the_caller_says_and_exact_only_when_every_child_is() -> None:
    parts = [child(0, 0.05, 0.004, 11, {}), child(1, 0.03, 0.003, 21, {}, final=False)]
    assert not client_result("cmpl-x-0", parts, final=False).final
    assert client_result("cmpl-x-0", parts, final=True).mode == "inferred"


def test_an_n4_whale_is_judged_by_its_client_requests_footprint() -> None:
    """Four children of a 1,024/200 request (siblings read the prompt's blocks from the cache) among 32/32 shorts:
    alone each child is ~200 tokens, under the bar; as one client request, 1,024 + 4 x 200."""
    shorts = [KvUse(f"s{i}", 32, 32) for i in range(20)]
    kids = [KvUse(f"{i}_w", 1024, 200, 0 if i == 0 else 1008) for i in range(4)]
    uses = shorts[:10] + kids + shorts[10:]
    apart = footprints(uses)
    assert max(apart[k.request_id] for k in kids) < 8 * 64 and not whales(apart, 8.0)
    together = footprints(client_uses(uses, {k.request_id: "w" for k in kids}))
    assert together["w"] == 1024 + 800 and whales(together, 8.0) == ["w"]
    assert client_uses(uses, {}) == uses  # no n>1 traffic: the uses as they are
