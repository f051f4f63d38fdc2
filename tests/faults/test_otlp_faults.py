"""Bad OTLP input at the agent's OTLP/HTTP port during a recorded run: garbage, truncated, oversized (413) and
gzip-bomb bodies are refused and counted; every real export sent twice gives no second result; spans of
requests the log never showed, and spans that arrive before their log lines, break nothing."""

from __future__ import annotations

import gzip
import random

import pytest

from .conftest import AgentFactory
from .harness import Export, Feed, LogWriter, StandInVllm, recorded, same_result, wait_until

MAX_BODY = 64 * 1024  # the agent's --otlp-max-body-bytes here; vLLM's exports in the recordings are < 8 KiB


@pytest.mark.timeout(180)
def test_bad_duplicated_and_early_spans(agent_factory: AgentFactory, stand_in: StandInVllm,
                                        log_writer: LogWriter) -> None:
    agent = agent_factory(extra_args=("--otlp-max-body-bytes", str(MAX_BODY)))
    rnd = random.Random(7)
    refused: list[tuple[str, int]] = []
    feed: Feed

    def bad_then_twice(body: bytes, export: Export) -> None:
        """Before each real export: garbage, the export cut short, an oversized body, a gzip bomb; then the
        real export twice (an SDK retrying after a lost response)."""
        bad = {
            "garbage": (bytes(rnd.randrange(256) for _ in range(2000)), None),
            "truncated": (body[: len(body) // 2], None),
            "oversized": (rnd.randbytes(MAX_BODY + 1), None),
            "gzip_bomb": (gzip.compress(b"\0" * (64 * MAX_BODY), compresslevel=9), "gzip"),
        }
        for name, (data, enc) in bad.items():
            refused.append((name, feed.post_raw(data, export.content_type, enc).status_code))
        chunked = feed._client.post(feed.otlp_url, content=iter([body, rnd.randbytes(MAX_BODY)]),
                                    headers={"Content-Type": export.content_type})  # no Content-Length
        refused.append(("oversized_chunked", chunked.status_code))
        feed.post_once(body, export)
        feed.post_once(body, export)

    rec = recorded("whale1")
    feed = Feed(rec, log_writer, stand_in, agent.otlp_url, post=bad_then_twice).start()
    feed.join(60)
    results = agent.wait_final(rec.span_ids)
    codes = {name: {c for n, c in refused if n == name} for name, _ in refused}
    assert codes == {"garbage": {400}, "truncated": {400}, "oversized": {413}, "gzip_bomb": {413},
                     "oversized_chunked": {413}}, codes
    m = agent.metrics()
    n = len(rec.exports)
    assert m.value("attrib_source_skipped_total", source="otlp", kind="malformed") == 2 * n
    assert m.value("attrib_source_skipped_total", source="otlp", kind="too_large") == 3 * n
    assert m.value("attrib_source_success_total", source="otlp") == 2 * n
    assert m.value("attrib_events_total", kind="request_span") == 2 * len(rec.span_ids)
    # the duplicate export gives no second result: one final result per request, counted once
    assert m.value("attrib_requests_attributed_total") == len(rec.span_ids)
    # ... also when the duplicates come late, after the results are final (an exporter retrying after a time-out)
    for body, export in zip(feed.bodies, rec.exports, strict=True):
        feed.post_once(body, export)
    wait_until(lambda: agent.metrics().value("attrib_events_total", kind="request_span") == 3 * len(rec.span_ids),
               15, "the late duplicates to be processed")
    settled = agent.metrics().value("attrib_source_success_total", source="pipeline")
    wait_until(lambda: agent.metrics().value("attrib_source_success_total", source="pipeline") > settled + 2, 15,
               "the pipeline to settle after the duplicates")
    m = agent.metrics()
    assert m.value("attrib_requests_attributed_total") == len(rec.span_ids)
    late = agent.finals(rec.span_ids)
    assert set(late) == set(results) and all(same_result(results[r], late[r]) for r in results)

    # Spans of requests the log never showed (another run's export, alone): refused nothing, broke nothing.
    strangers = recorded("shorts")
    stray = Feed(strangers, log_writer, stand_in, agent.otlp_url)
    for body, export in zip(strangers.bodies(strangers.delta_for(feed.started_wall or 0.0)), strangers.exports,
                            strict=True):
        stray.post_once(body, export)
    stray._client.close()
    assert agent.healthy()
    answers = {rid: r.status_code for rid, r in agent.culprits(strangers.span_ids).items()}
    print("strangers:", answers)
    assert set(answers.values()) <= {200, 202, 404}, answers
    kept = agent.finals(rec.span_ids)
    assert set(kept) == set(results) and all(same_result(results[r], kept[r]) for r in results)

    # Events out of order: a run's spans all arrive before any of its log lines.
    early = recorded("canary")
    Feed(early, log_writer, stand_in, agent.otlp_url, spans_first=True).start().join(60)
    agent.wait_final(early.span_ids)
    m2 = agent.metrics()
    assert m2.value("attrib_source_errors_total", source="otlp") == 0
    assert agent.healthy() and "Traceback" not in agent.output()
