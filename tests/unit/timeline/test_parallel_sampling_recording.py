"""n>1 requests (parallel sampling) on a real recording (recordings/nseq-steps, `lab record --scenario nseq
--truth-plugin`): 20 shorts beside two 256/64 requests with n=3 and a 1,024/200 one with n=4.

vLLM 0.32 runs each child as its own engine request (`<i>_<id>`, own sequence and KV blocks, prefix shared) and
exports a span for each, named by the parent's id. The timeline must hold each child as a request, in the steps
vLLM ran it in with the blocks vLLM gave it, each with its own span's numbers. On the start commit the children
were one lifecycle: none of the 329 steps they ran in had vLLM's members (membership error 2,601 summed, blocks
off by 6.8 a request), and the request showed one child's 64 tokens of the 192 the client got."""

from __future__ import annotations

import json
import lzma
from functools import cache
from pathlib import Path

from attrib_agent.events import Event
from attrib_agent.lab.score import replayed_timeline
from attrib_agent.lab.step_truth import score_recording, truth_steps
from attrib_agent.pipeline import AttributionPipeline
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.vllm_ids import CHILD_PREFIX

RECORDING = Path(__file__).parents[2] / "fixtures" / "recordings" / "nseq-steps"


@cache
def events() -> tuple[Event, ...]:
    return tuple(ReplaySource(RECORDING).events())


def client() -> dict[str, dict[str, object]]:
    rows = [json.loads(x) for x in lzma.open(RECORDING / "client.jsonl.xz", "rt")]
    return {str(r["vllm_request_id"]): r for r in rows}


def test_the_recording_has_n_gt_1_requests_that_vllm_ran_as_children() -> None:
    sent = {rid: r for rid, r in client().items() if int(r["n"]) > 1}  # type: ignore[call-overload]
    assert sorted(int(r["n"]) for r in sent.values()) == [3, 3, 4]  # type: ignore[call-overload]
    assert all(r["status"] == "ok" for r in sent.values())
    members = {s for t in truth_steps(Recording(RECORDING).records(VLLM_STEPS)) for s in t.members}
    assert {f"{i}_{rid}" for rid, r in sent.items() for i in range(int(r["n"]))} <= members  # type: ignore[call-overload]
    assert not sent.keys() & members  # the parent itself never runs


def test_every_step_has_vllms_members_and_blocks() -> None:
    s = score_recording(RECORDING)
    assert s is not None and s.steps_in_timeline == s.steps > 800
    assert s.membership_share == 1.0  # start commit: 62 %
    assert s.block_mean_abs_error is not None and s.block_mean_abs_error < 0.1  # start commit: 5.1
    tl = replayed_timeline(RECORDING)
    assert all(st.membership_error == 0 for st in tl.steps())


def test_each_child_is_a_request_with_its_own_span_and_the_children_add_up_to_what_the_client_got() -> None:
    tl = replayed_timeline(RECORDING)
    lcs = {lc.request_id: lc for lc in tl.lifecycles()}
    for rid, r in client().items():
        kids = [lc for k, lc in lcs.items() if (m := CHILD_PREFIX.fullmatch(k)) and m["parent"] == rid]
        n = int(r["n"])  # type: ignore[call-overload]
        assert len(kids) == (n if n > 1 else 0) and (rid in lcs) == (n == 1)
        if n > 1:
            assert all(lc.complete and lc.prompt_tokens == r["prompt_tokens"] for lc in kids)
            assert sum(lc.completion_tokens or 0 for lc in kids) == r["output_tokens"]  # start commit: one child's


def test_the_pipeline_attributes_each_child_and_reports_one_result_per_client_request() -> None:
    """Each child is attributed on its own lifecycle (its own span); the agent reports the client request's one
    result (tests/unit/test_pipeline_parallel_sampling.py goes through the API)."""
    p = AttributionPipeline()
    results = {r.request_id: r for r in [*p.feed_all(list(events())), *p.settle()]}
    assert not any(CHILD_PREFIX.fullmatch(k) for k in results) and len(results) == 23
    rows = client()
    assert all(results[rid].completion_tokens == r["output_tokens"] for rid, r in rows.items())
    multi = [rid for rid, r in rows.items() if int(r["n"]) > 1]  # type: ignore[call-overload]
    assert len({(results[k].trace_id, results[k].span_id) for k in multi}) == 3  # each its first child's span
