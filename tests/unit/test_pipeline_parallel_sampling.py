"""Requests with n > 1 (parallel sampling) on a real recording (recordings/nseq-steps: 20 shorts beside two 256/64
requests with n=3 and a 1,024/200 one with n=4), through the real interface: replay, pipeline, API.

The timeline keeps each child apart (vLLM 0.32 runs each as its own engine request); what the agent reports is one
result per client request (`attribution.result.client_result`), and as a culprit the client request is one player
whose children leave together. On the start commit the children were folded into one lifecycle: each client
request reported one child's tokens (64 of 192, 200 of 800), and the n=4 whale, weighed by one child, was no whale.
"""

from __future__ import annotations

import asyncio
import json
import lzma
import shutil
from dataclasses import replace
from functools import cache
from pathlib import Path

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from attrib_agent.agent.core import AgentCore
from attrib_agent.agent.replay import replay_into, tell_spans_to_log
from attrib_agent.attribution.result import AttributionResult
from attrib_agent.config.load import AgentConfig
from attrib_agent.events import Event, RequestAborted, RequestAdded, RequestSpan
from attrib_agent.lab.step_truth import truth_steps
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.recording import LOG, VLLM_STEPS, Recording
from attrib_agent.sinks.api.app import api_app
from attrib_agent.sinks.otel.spans import QUEUE_EVENT, SlowdownSpans
from attrib_agent.sources.log.source import LogRecordParser
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import MAX_EARLY_SPANS, EngineTimeline
from attrib_agent.vllm_ids import CHILD_PREFIX
from tests.unit.sinks.api_replayed import call, state_of
from tests.unit.timeline.plugin_kv import held_after, plugin_messages

RECORDING = Path(__file__).parent.parent / "fixtures" / "recordings" / "nseq-steps"


def sent() -> dict[str, dict[str, object]]:
    """What the lab's client sent and got, by vLLM's id of the request."""
    rows = [json.loads(x) for x in lzma.open(RECORDING / "client.jsonl.xz", "rt")]
    return {str(r["vllm_request_id"]): r for r in rows}


def n_of(row: dict[str, object]) -> int:
    return int(str(row["n"]))


def replay(path: Path) -> tuple[AttributionPipeline, dict[str, AttributionResult], ReplaySource]:
    """The recording as the agent replays it (the log parser told of each span as it arrives)."""
    p = AttributionPipeline()
    source = ReplaySource(path)
    core = AgentCore(p)
    tell_spans_to_log(core, source)
    out: list[AttributionResult] = []
    for ev in source.events():
        if isinstance(ev, RequestSpan):
            core.span_arrived(ev)
        out.extend(p.feed(ev))
    out.extend(p.settle())
    return p, {r.request_id: r for r in out if r.final}, source


@cache
def in_log_order() -> tuple[AttributionPipeline, dict[str, AttributionResult]]:
    p, finals, _ = replay(RECORDING)
    return p, finals


def test_each_client_request_has_one_result_with_its_childrens_tokens() -> None:
    p, finals = in_log_order()
    rows = sent()
    assert set(finals) == set(rows)  # one final result per client request, none per child
    assert not any(CHILD_PREFIX.fullmatch(rid) for r in finals.values() for rid in
                   (r.request_id, *(c.request_id for c in r.culprits)))
    for rid, row in rows.items():
        assert finals[rid].completion_tokens == row["output_tokens"], rid  # start commit: 64 of 192, 200 of 800
        assert p.result(rid) == finals[rid]


def test_a_client_requests_itl_gaps_are_its_childrens() -> None:
    """vLLM's ITL histogram pools each child's tokens - 1 gaps: the n=3 x 64 requests have 189 (start commit: 191,
    the summed tokens - 1), the n=4 x 200 one 796 (799). Victim seconds, the store and the API count those."""
    p, finals = in_log_order()
    app = api_app(state_of(p))
    tokens: dict[str, list[int]] = {}  # each child's span names the parent, with that child's tokens
    for ev in ReplaySource(RECORDING).events():
        if isinstance(ev, RequestSpan) and ev.completion_tokens is not None:
            tokens.setdefault(ev.request_id, []).append(ev.completion_tokens)
    for rid, row in sent().items():
        r, n = finals[rid], n_of(row)
        assert len(tokens[rid]) == n and sum(tokens[rid]) == row["output_tokens"]
        gaps = sum(t - 1 for t in tokens[rid])
        assert (r.sequences, r.itl_gaps) == (n, gaps), rid
        assert r.victim_seconds() == r.ttft_slowdown_s + r.itl_slowdown_s * gaps
        stored = p.result(rid)  # packed in the store and read back
        assert stored is not None and (stored.sequences, stored.itl_gaps) == (n, gaps)
        body = call(app, f"/v1/requests/{rid}/culprits").json()
        assert body["sequences"] == n
    assert sorted({finals[rid].itl_gaps for rid, row in sent().items() if n_of(row) > 1}) == [189, 796]


def test_the_n_gt_1_requests_answer_by_every_id_with_the_one_result() -> None:
    """The client's X-Request-Id, vLLM's id, the parent's and each child's engine id from the log, a child's own
    id: all name the client request's one result."""
    p, finals = in_log_order()
    app = api_app(state_of(p))
    added = [e for e in ReplaySource(RECORDING).events() if isinstance(e, RequestAdded)]
    for rid, row in sent().items():
        if n_of(row) == 1:
            continue
        kids = [e.internal_id for e in added if (m := CHILD_PREFIX.fullmatch(e.request_id)) and m["parent"] == rid]
        assert len(kids) == n_of(row)
        engine_parent = kids[0].split("_", 1)[1]
        forms = [rid, rid.removeprefix("cmpl-").removesuffix("-0"), engine_parent, *kids, f"1_{rid}"]
        for form in forms:
            resp = call(app, f"/v1/requests/{form}/culprits")
            assert resp.status_code == 200, form  # start commit: the tokens of one child (and a child's id 404)
            body = resp.json()
            assert body["request_id"] == rid and body["completion_tokens"] == row["output_tokens"], form
            assert body["status"] == "final"


def test_the_n4_whale_is_one_culprit_and_a_whale() -> None:
    """Its four children (1,024 prompt tokens held once, 4 x 200 outputs) are one client request: one player, one
    culprit, judged a whale by the client's footprint; a short it slowed names it, never a child."""
    p, finals = in_log_order()
    whale = next(rid for rid, row in sent().items() if n_of(row) == 4)
    assert finals[whale].is_whale  # start commit: no whale (one child's 1,224 tokens)
    blamed = [c for r in finals.values() for c in r.culprits if c.request_id.endswith(whale)]
    assert blamed and all(c.request_id == whale and c.is_whale for c in blamed)  # start commit: not a whale


def _span_first(tmp: Path, spans: int = 1, received: bool = True) -> tuple[Path, set[str]]:
    """A copy of the recording whose log lines `Received` (unless not `received`: read in its place) and `Added` of
    each n>1 request are read just after its `spans`-th span (as live polling of the log, 0.1 s, can do for a short
    request; or all `n`: every child's span before the parent's lines and the children's)."""
    parents = {rid for rid, row in sent().items() if n_of(row) > 1}
    seen: dict[str, list[float]] = {}
    for ev in ReplaySource(RECORDING).events():
        if isinstance(ev, RequestSpan) and ev.request_id in parents:
            seen.setdefault(ev.request_id, []).append(ev.ts)
    first_span = {rid: ts[min(spans, len(ts)) - 1] for rid, ts in seen.items()}
    out = tmp / f"nseq-span-first-{spans}-{received}"
    shutil.copytree(RECORDING, out)
    records = [json.loads(x) for x in lzma.open(RECORDING / "log.jsonl.xz", "rt")]
    moved = 0
    for i, rec in enumerate(records):
        for rid in parents:
            line = rec["line"]
            if (received and f"Received request {rid}:" in line) or (f"_{rid}-" in line and "Added request" in line):
                rec["ts"] = first_span[rid] + 1e-6 * (i + 1) / len(records)
                moved += 1
    assert moved == sum(received + n_of(r) for r in sent().values() if n_of(r) > 1)
    records.sort(key=lambda r: r["ts"])
    with lzma.open(out / "log.jsonl.xz", "wt") as f:
        f.writelines(json.dumps(r) + "\n" for r in records)
    return out, parents


@pytest.mark.parametrize(("spans", "received"), [(1, True), (2, True), (4, True), (1, False), (4, False)])
def test_a_childs_span_before_its_added_line_gives_the_log_orders_results(tmp_path: Path, spans: int,
                                                                          received: bool) -> None:
    """One, two, or every child's span (n = 3 or 4) before the parent's `Received` and its children's `Added`, or
    (a log poll between the two lines) after `Received` and before the `Added` lines."""
    path, parents = _span_first(tmp_path, spans, received)
    order = [e for e in ReplaySource(path).events() if isinstance(e, RequestSpan | RequestAdded)]
    for rid in parents:  # the reordering took: `spans` spans named by the parent before any of its children's lines
        first = next(i for i, e in enumerate(order) if isinstance(e, RequestAdded) and e.request_id.endswith(rid))
        early = [e for e in order[:first] if isinstance(e, RequestSpan) and e.request_id == rid]
        assert len(early) >= min(spans, n_of(sent()[rid])), rid  # (children ending together: more may come first)
    p, finals, source = replay(path)
    base_p, base = in_log_order()
    assert set(finals) == set(base)
    for rid in parents:
        assert finals[rid] == base[rid], rid
    assert {rid: r for rid, r in finals.items() if rid not in parents} == {
        rid: r for rid, r in base.items() if rid not in parents}
    # no phantom: the parent is no lifecycle of its own, its children are, each with one span
    for rid in parents:
        assert p.timeline.lifecycle(rid) is None
        kids = p.timeline.children(rid)
        assert kids == base_p.timeline.children(rid)
        assert all((lc := p.timeline.lifecycle(k)) is not None and lc.complete for k in kids)
    # and the log parser's in-flight memory empties, as in log order (each child ended by one of the spans)
    log = source.parsers[LOG]
    assert isinstance(log, LogRecordParser)
    ids = log.line_parser.ids
    assert ids.sizes()["in_flight"] == 0 and ids.parents() == 0


def test_a_shed_share_takes_or_leaves_a_client_requests_children_together() -> None:
    """Load shedding chooses by the client request's id (its children's ids hash apart): at half, the n=4 request
    is taken whole and the n=3 ones are skipped whole (by crc32: 0.43, 0.95, 0.94 of the range)."""
    p = AttributionPipeline()
    p.attribute_share = 0.5
    out = [*p.feed_all(list(ReplaySource(RECORDING).events())), *p.settle()]
    for rid, row in sent().items():
        if n_of(row) == 4:
            (r,) = [x for x in out if x.request_id == rid and x.final]
            assert r.completion_tokens == row["output_tokens"]
        elif n_of(row) == 3:
            assert p.result(rid) is None and p.status(rid) == "skipped"


def test_the_maps_for_n_gt_1_are_bounded() -> None:
    """Children filed -> client (max_results), client requests waiting for a child (max_pending), spans ahead of
    the log (MAX_EARLY_SPANS)."""
    p = AttributionPipeline(PipelineConfig(max_results=4))
    for ev in ReplaySource(RECORDING).events():
        p.feed(ev)
        assert p.clients.filed() <= 4
    p.settle()
    assert p.clients.filed() == 4  # 10 children filed: the bound held it
    p = AttributionPipeline(PipelineConfig(max_pending=2))
    for i in range(5):  # five client requests each with one child's partial result
        p.clients.file(p.timeline, f"cmpl-{i}-0", AttributionResult(
            f"0_cmpl-{i}-0", 1.0, 0.1, 0.1, 0.0, None, None, 0.0, (), 0.0, 0.0, True, 1.0, final=False))
    assert list(p.clients._parts) == ["cmpl-3-0", "cmpl-4-0"] and p.dropped_pending == 3
    tl = EngineTimeline()
    for i in range(MAX_EARLY_SPANS + 50):
        tl.feed(RequestSpan(ts=float(i), request_id=f"cmpl-{i}-0", trace_id="0" * 32, span_id=f"{i:016x}",
                            start_ts=float(i), end_ts=i + 0.5, queue_s=0.0, ttft_s=0.1, e2e_s=0.5, prefill_s=0.1,
                            decode_s=0.4, inference_s=0.5, prompt_tokens=8, completion_tokens=4, max_tokens=4))
    assert len(tl._early) == MAX_EARLY_SPANS and not tl._early_kids


def test_a_client_request_with_an_aborted_child_is_final_with_the_others() -> None:
    """One child of an n=3 request aborted (its span never comes): the result is final, with the two that finished
    (before, it stayed partial for ever, waiting for the aborted child's part)."""
    parent = next(rid for rid, row in sent().items() if n_of(row) == 3)
    events: list[Event] = []
    spans, abort_at = 0, float("inf")
    for ev in ReplaySource(RECORDING).events():
        if ev.ts >= abort_at:  # the abort a while after the others' results were filed
            events.append(RequestAborted(ts=ev.ts, log_ts=None, request_id=f"2_{parent}"))
            abort_at = float("inf")
        if isinstance(ev, RequestSpan) and ev.request_id == parent and (spans := spans + 1) == 3:
            abort_at = ev.ts + 1.0
            continue
        events.append(ev)
    p = AttributionPipeline()
    out = [*p.feed_all(events), *p.settle()]
    (r,) = [x for x in out if x.request_id == parent and x.final]
    assert r.completion_tokens == 128 and p.status(parent) == "final" and not len(p.clients)


def test_spans_carry_the_client_requests_id_under_its_first_childs_vllm_span() -> None:
    """The `attrib.slowdown` span of an n>1 request names the client request, with its summed tokens, as a child
    of its first child's `llm_request`; a short it slowed links to that span."""
    p, _ = in_log_order()
    out: list[AttributionResult] = list(p.store)
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    SlowdownSpans(provider).emit_all(out, p.span_of, p)  # the pipeline, as the agent's state reads it
    got = {str((s.attributes or {})["gen_ai.request.id"]): s for s in exporter.get_finished_spans()}
    provider.shutdown()
    rows = sent()
    multi = [rid for rid, row in rows.items() if n_of(row) > 1]
    assert set(multi) <= set(got)  # each slowed (ITL): its span is there, under the client's id
    for rid in multi:
        s, r = got[rid], p.result(rid)
        assert r is not None and (s.attributes or {})["gen_ai.usage.output_tokens"] == rows[rid]["output_tokens"]
        assert s.parent is not None and f"{s.parent.span_id:016x}" == r.span_id
        kids = [lc for lc in p.timeline.lifecycles() if CHILD_PREFIX.fullmatch(lc.request_id)
                and lc.request_id.split("_", 1)[1] == rid]
        waits = [e for e in s.events if e.name == QUEUE_EVENT]  # its queue wait: until its first child ran
        assert len(kids) == n_of(rows[rid]) and len(waits) == 1
        first = min(k.scheduled_ts for k in kids if k.scheduled_ts is not None)
        assert waits[0].timestamp == int(first * 1e9)
        assert (waits[0].attributes or {})["attrib.queue.wait_s"] == first - min(
            k.arrival_ts for k in kids if k.arrival_ts is not None)
    whale = next(rid for rid in multi if n_of(rows[rid]) == 4)
    linked = [s for s in got.values() if any(f"{ln.context.span_id:016x}" == p.span_of(whale)[1]  # type: ignore[index]
                                             for ln in s.links)]
    assert linked and all(str((s.attributes or {})["gen_ai.request.id"]) not in multi for s in linked)


def _replayed(exact: bool) -> AttributionPipeline:
    """The recording through `attrib-agent replay [--exact]`'s own path (`replay_into`)."""
    core = AgentCore.from_config(AgentConfig(), live=False)
    asyncio.run(replay_into(core, RECORDING, exact=exact))
    return core.pipeline


def test_exact_mode_reads_each_childs_steps_from_vllm_and_reports_the_client_requests() -> None:
    """`replay --exact` (the step plugin's stream, docs/exact-mode.md): every step the children ran in is vLLM's own
    (members, each one's tokens, KV blocks and prefix-cache hits, the plugin's `<i>_<id>-<8 hex>` ids mapped to
    the children's `<i>_<id>`), and the agent reports one `exact` result per client request, whose tokens, gaps,
    blame, whales and culprits' KV block-seconds are the inferred replay's (the inference already matched vLLM's
    members and blocks on every step here; the block-seconds against the plugin's: timeline/test_exact_kv.py)."""
    exact, inferred = _replayed(exact=True), _replayed(exact=False)
    truth = truth_steps(Recording(RECORDING).records(VLLM_STEPS))
    after = held_after(plugin_messages(RECORDING)[1])
    by_iter = {si.iteration: out for si, out in exact.timeline.outcomes()}
    kids = set(exact.timeline.clients())
    assert len(kids) == 10 and sum(bool(t.members & kids) for t in truth) == 329
    for t in truth:
        out = by_iter[t.iteration]
        assert frozenset(m.request_id for m in out.record.members) == t.members
        assert dict(out.holdings) == after[t.iteration]  # less the requests that finished at its end
    hits = {k: exact.timeline.cached_prompt_tokens(k) for k in kids}
    assert sorted(hits.values()) == [0, 0, 0, 128, 128, 128, 128, 896, 896, 896]  # siblings read the prompt's blocks
    got = {r.request_id: r for r in exact.store}
    want = {r.request_id: r for r in inferred.store}
    assert set(got) == set(want) == set(sent()) and {r.mode for r in got.values()} == {"exact"}
    assert {r.mode for r in want.values()} == {"inferred"}
    for rid, r in got.items():
        w = want[rid]
        assert replace(r, mode=w.mode) == w, rid
    app = api_app(state_of(exact))
    for rid, row in sent().items():
        body = call(app, f"/v1/requests/{rid}/culprits").json()
        want_body = ("exact", row["output_tokens"], n_of(row))
        assert (body["mode"], body["completion_tokens"], body["sequences"]) == want_body
