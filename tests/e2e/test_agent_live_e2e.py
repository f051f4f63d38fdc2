"""`attrib-agent run` beside a real vLLM during a whale scenario: the API names the whale, /metrics shows the
series, slowdown spans with links reach an OTLP receiver, and after SIGKILL the journal serves the results."""

from __future__ import annotations

import time

import httpx
import pytest

from attrib_agent.lab.record import record_run
from attrib_agent.lab.sidecar import agent_beside, poll_until
from attrib_agent.lab.span_sink import SpanSink
from attrib_agent.lab.summary import shorts
from attrib_agent.lab.workload import get_scenario
from attrib_agent.recording import CLIENT, Recording


@pytest.fixture(scope="module")
def live_run(lab, tmp_path_factory):
    root = tmp_path_factory.mktemp("agent")
    journal = root / "journal"
    with SpanSink() as spans, agent_beside(lab, root, journal_dir=journal, otlp_export=spans.url) as agent:
        res = record_run(lab, get_scenario("preempt"), root / "rec", attempts=5)
        rec = Recording(root / "rec")
        ids = {c["vllm_request_id"]: c for c in rec.records(CLIENT)}
        with httpx.Client(trust_env=False, timeout=10) as c:
            def all_final():
                got = {rid: c.get(f"{agent.api_url}/v1/requests/{rid}/culprits") for rid in ids}
                return got if all(r.status_code == 200 and r.json().get("status") == "final"
                                  for r in got.values()) else None  # not `skipped` (load shed)
            answers = poll_until(all_final, 60) or {rid: c.get(f"{agent.api_url}/v1/requests/{rid}/culprits")
                                                   for rid in ids}
            metrics = c.get(f"{agent.api_url}/metrics").text
            top = c.get(f"{agent.api_url}/v1/culprits/top", params={"window": "1h"}).json()
        poll_until(lambda: spans.spans("attrib.slowdown"), 15)
        time.sleep(1.5)  # the journal's promise: a crash loses at most the last second of results
        agent.kill()
        agent.start()  # the same journal: earlier results are served again
        with httpx.Client(trust_env=False, timeout=10) as c:
            after = {rid: c.get(f"{agent.api_url}/v1/requests/{rid}/culprits") for rid in ids}
        yield {"res": res, "client": ids, "answers": answers, "metrics": metrics, "top": top,
               "spans": spans.spans("attrib.slowdown"), "after": after, "log": (root / "agent.log").read_text()}


def test_every_request_of_the_run_is_attributed(live_run):
    codes = {rid: r.status_code for rid, r in live_run["answers"].items()}
    assert set(codes.values()) == {200}, (codes, live_run["log"][-3000:])


def test_the_api_names_a_whale_as_top_culprit_of_the_slowed_shorts(live_run):
    client = live_run["client"]
    # Slowed as vLLM saw them (its span's TTFT, from the moment its API server took the request): what the agent
    # can explain. On 2 cores the client also sees delays before that moment (vLLM's API server starved of CPU
    # while the engine core spins), which no vLLM signal shows; see docs/attribution.md, "Limits".
    def seen_ttft(r: dict) -> float:
        return float(live_run["answers"][r["vllm_request_id"]].json().get("ttft_s") or 0.0)

    slowed = sorted((r for r in shorts(client.values()) if seen_ttft(r) > 0.5), key=seen_ttft, reverse=True)
    assert slowed, "the scenario should slow some shorts"
    named = 0
    for r in slowed:
        body = live_run["answers"][r["vllm_request_id"]].json()
        assert body["ttft_slowdown_s"] > 0.2
        top = body["culprits"][0] if body["culprits"] else None
        whales = {c["vllm_request_id"] for c in client.values() if c["is_whale"]}
        named += top is not None and top["request_id"] in whales
    assert named >= 0.8 * len(slowed), (named, len(slowed))
    # The 1 h window also holds a rejected (late) attempt's requests, which the agent watched too: the top culprit
    # is a whale of the scenario (its spec id, from the lab, in `cmpl-<run tag>-<spec id>-0`), of whichever attempt.
    whale_specs = {r["spec_id"] for r in live_run["res"].meta["scenario"]["requests"] if r["is_whale"]}
    top_id = live_run["top"]["culprits"][0]["request_id"]
    assert top_id.startswith("cmpl-") and top_id.rsplit("-", 2)[-2] in whale_specs, (top_id, whale_specs)


def test_metrics_show_the_attributed_slowdown(live_run):
    text = live_run["metrics"]
    whale_rows = [ln for ln in text.splitlines()
                  if ln.startswith("attrib_attributed_slowdown_seconds_total{") and 'culprit_class="whale"' in ln]
    assert whale_rows and sum(float(ln.rsplit(" ", 1)[1]) for ln in whale_rows) > 0.5
    assert 'attrib_source_up{source="vllm_metrics"} 1.0' in text


def test_slowdown_spans_with_links_reach_the_collector(live_run):
    spans = live_run["spans"]
    assert spans
    linked = [s for s in spans if len(s.links) > 0]
    assert linked
    s = linked[0]
    assert len(s.trace_id) == 16 and len(s.parent_span_id) == 8  # child of vLLM's llm_request span


def test_after_sigkill_the_journal_serves_the_earlier_results(live_run):
    before, after = live_run["answers"], live_run["after"]
    lost = [rid for rid in before if after[rid].status_code != 200]
    assert not lost
    for rid in before:
        assert after[rid].json()["culprits"] == before[rid].json()["culprits"]
