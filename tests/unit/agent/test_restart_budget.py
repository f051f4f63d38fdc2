"""A sidecar restarted beside a running vLLM (`--log-from end`, the default) knows vLLM's step budget: the log
follower reads the running vLLM's start-up budget line back from before the end (sources/log/tailer.py), and the
agent says where its budget comes from (/readyz, /v1/timeline, `attrib_token_budget_origin`).

Real lines only: a recorded vLLM 0.32 start-up with `--max-num-batched-tokens 4096`, then traffic and a second
start-up from nu16's by-hand run (that vLLM's budget line never reached the file: the logging-config bug fixed
beside this, so it stands for a vLLM restarted without the flag)."""

from __future__ import annotations

import argparse
import asyncio
import io
import json
import threading
import urllib.request
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from attrib_agent.agent.budget_store import FILE, decode, encode
from attrib_agent.agent.live import LiveAgent
from attrib_agent.config.load import add_run_arguments, load_config
from attrib_agent.health import SourceHealth
from attrib_agent.recording import METRICS, Recording
from attrib_agent.sources.log.parser import LogLineParser
from attrib_agent.sources.log.tailer import startup_budget_line
from attrib_agent.timeline.engine_timeline import EngineTimeline

STARTUP = Path(__file__).parents[2] / "fixtures" / "vllm-startup"
BUDGET_START = (STARTUP / "budget-4096.log").read_bytes()  # vLLM's stdout as it started, budget line included
TRAFFIC = (STARTUP / "by-hand-traffic.log").read_bytes()  # 40 request and step lines after it
RESTART = (STARTUP / "by-hand-restart.log").read_bytes()  # a later start-up with no budget line
# vLLM's /metrics as the lab's vLLM served it (model `tiny`, 96 blocks of 128 tokens): the engine to match
SCRAPE = next(iter(Recording(STARTUP.parent / "recordings" / "preempt").records(METRICS)))["text"].encode()


@pytest.fixture
def vllm_url() -> Iterator[str]:
    """A stand-in vLLM serving the recorded /metrics scrape."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(SCRAPE)))
            self.end_headers()
            self.wfile.write(SCRAPE)

        def log_message(self, *args: object) -> None:
            pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def _get(port: int, path: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=5) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode()


def _live_agent(log: Path, log_from: str, vllm_url: str = "http://127.0.0.1:9", *flags: str) -> LiveAgent:
    """`attrib-agent run` on `log` as a sidecar starts it (no OTLP ports; the API on a free port)."""
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    return LiveAgent(load_config(parser.parse_args([
        "--vllm-url", vllm_url, "--listen", "127.0.0.1:0", "--log-file", str(log), "--otlp-grpc-port", "0",
        "--otlp-http-port", "0", "--log-from", log_from, *flags]), {}))


def _restarted_agent(log: Path, vllm_url: str = "http://127.0.0.1:9",
                     state_dir: Path | None = None) -> tuple[dict[str, object], int, str]:
    """An agent started on `log` as a restarted sidecar is (`--log-from end`), and traffic logged after: /readyz's
    budget, /v1/timeline's, and the /metrics text, once the pipeline has read the new steps."""
    agent = _live_agent(log, "end", vllm_url, *(["--state-dir", str(state_dir)] if state_dir is not None else []))
    got: list[tuple[dict[str, object], int, str]] = []

    async def main() -> None:
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        while agent.api_port is None:
            await asyncio.sleep(0.02)
        port = agent.api_port
        await asyncio.sleep(0.3)  # the follower's first poll opens the file at its end
        with log.open("ab") as f:
            f.write(TRAFFIC)  # the traffic goes on after the restart
        for _ in range(200):  # the log's first poll, then the pipeline's feed of the lines after it
            await asyncio.sleep(0.05)
            _, body = await asyncio.to_thread(_get, port, "/metrics")
            if "attrib_engine_steps_total 0.0" not in body and 'attrib_cost_model_fitted' in body and (
                    vllm_url.endswith(":9") or "attrib_vllm_gap_seconds 0.0" in body):
                await asyncio.sleep(0.6)  # a sink flush (0.5 s) after the first scrape
                break
        _, ready = await asyncio.to_thread(_get, port, "/readyz")
        _, timeline = await asyncio.to_thread(_get, port, "/v1/timeline?window=1m")
        _, metrics = await asyncio.to_thread(_get, port, "/metrics")
        got.append((json.loads(ready)["token_budget"], json.loads(timeline)["token_budget"], metrics))
        stop.set()
        await run

    asyncio.run(main())
    return got[0]


def test_restarted_beside_a_running_vllm_it_reads_the_budget_line_back(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(BUDGET_START + TRAFFIC)
    ready, timeline, metrics = _restarted_agent(log)
    assert ready == {"tokens": 4096, "source": "announced"}
    assert timeline == 4096
    assert "attrib_token_budget_tokens 4096.0" in metrics
    assert 'attrib_token_budget_origin{origin="announced"} 1.0' in metrics


def test_a_vllm_restarted_without_the_line_leaves_the_budget_guessed_and_says_so(tmp_path: Path) -> None:
    log = tmp_path / "vllm.log"
    log.write_bytes(BUDGET_START + TRAFFIC + RESTART)
    ready, timeline, metrics = _restarted_agent(log)
    assert ready == {"tokens": 2048, "source": "guessed"}  # no step yet: vLLM's smallest default
    assert timeline == 2048
    assert "attrib_token_budget_tokens 2048.0" in metrics
    assert 'attrib_token_budget_origin{origin="guessed"} 1.0' in metrics


@pytest.mark.parametrize("chunk", [64, 1000, 1 << 20])
def test_the_look_back_is_the_same_whatever_its_chunk_and_bounded(chunk: int) -> None:
    """Marks split across chunks are still found; nothing is read further back than `limit`."""
    data = BUDGET_START + TRAFFIC
    seen, line = startup_budget_line(io.BytesIO(data), len(data), chunk=chunk)
    assert seen == "budget" and line is not None
    assert line.endswith("Chunked prefill is enabled with max_num_batched_tokens=4096.")
    assert line.startswith("(APIServer pid=29561) INFO 2026-11-27 05:14:44.414 [scheduler.py:307] ")
    assert startup_budget_line(io.BytesIO(data + RESTART), len(data + RESTART), chunk=chunk) == ("restart", None)
    assert startup_budget_line(io.BytesIO(data), len(data), limit=len(TRAFFIC), chunk=chunk) == ("none", None)
    assert startup_budget_line(io.BytesIO(TRAFFIC), len(TRAFFIC), chunk=chunk) == ("none", None)


MODEL = "tiny"  # the recorded scrape's model_name


def test_the_budget_read_is_kept_and_a_later_agent_whose_log_lost_the_line_takes_it(
        tmp_path: Path, vllm_url: str) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    log.write_bytes(BUDGET_START + TRAFFIC)
    ready, _, _ = _restarted_agent(log, vllm_url, state)
    assert ready == {"tokens": 4096, "source": "announced"}
    saved = state / FILE.format(engine=0)
    assert decode(saved.read_bytes()) == ((MODEL, 128, 96), 4096)
    log.write_bytes(TRAFFIC)  # rotated: the start-up is no longer in the file
    ready, timeline, metrics = _restarted_agent(log, vllm_url, state)
    assert ready == {"tokens": 4096, "source": "saved"} and timeline == 4096
    assert 'attrib_token_budget_origin{origin="saved"} 1.0' in metrics


def test_a_saved_budget_yields_to_the_log_and_to_another_engine(tmp_path: Path, vllm_url: str) -> None:
    log, state = tmp_path / "vllm.log", tmp_path / "state"
    state.mkdir()
    saved = state / FILE.format(engine=0)
    saved.write_bytes(encode((MODEL, 128, 96), 4096))
    log.write_bytes(BUDGET_START + TRAFFIC + RESTART)  # vLLM restarted without the flag: its default, not 4096
    ready, _, _ = _restarted_agent(log, vllm_url, state)
    assert ready == {"tokens": 2048, "source": "guessed"}
    saved.write_bytes(encode((MODEL, 128, 192), 4096))  # another pool: another engine
    log.write_bytes(TRAFFIC)
    ready, _, metrics = _restarted_agent(log, vllm_url, state)
    assert ready == {"tokens": 2048, "source": "guessed"}
    assert 'attrib_source_skipped_total{kind="mismatch",source="budget_state"} 1.0' in metrics


ABORTED = (STARTUP / "by-hand-abort.log").read_bytes()  # a client that hung up mid-stream, as vLLM logged it


def _agent_answers(log: Path, journal: Path, log_from: str, request_id: str) -> tuple[int, str]:
    """An agent on `log` with `journal`: /v1/requests/<id>/culprits once its log's first poll is read."""
    agent = _live_agent(log, log_from, "http://127.0.0.1:9", "--journal-dir", str(journal))
    got: list[tuple[int, str]] = []

    async def main() -> None:
        stop = asyncio.Event()
        run = asyncio.create_task(agent.run(stop))
        while agent.api_port is None:
            await asyncio.sleep(0.02)
        for _ in range(40):  # the log's first poll, and a journal flush (every 0.5 s) after it
            await asyncio.sleep(0.05)
            if agent.core.pipeline.events["RequestAborted"] or log_from == "end":
                break
        await asyncio.sleep(0.6)
        got.append(await asyncio.to_thread(_get, agent.api_port, f"/v1/requests/{request_id}/culprits"))
        stop.set()
        await run

    asyncio.run(main())
    return got[0]


def test_a_request_aborted_before_a_restart_still_answers_aborted(tmp_path: Path) -> None:
    """nu16's run: a client hung up mid-stream before the agent restarted; afterwards its id answered 404 unknown
    (only results were journaled). Asked by vLLM's engine id, as the log shows it."""
    log, journal = tmp_path / "vllm.log", tmp_path / "journal"
    log.write_bytes(ABORTED)
    engine_id = "cmpl-r3-abort-0-82cab0d6"
    status, body = _agent_answers(log, journal, "start", engine_id)
    assert (status, json.loads(body)["status"]) == (200, "aborted")
    status, body = _agent_answers(log, journal, "end", engine_id)  # restarted: the lines are behind it now
    assert (status, json.loads(body)) == (200, {"request_id": "cmpl-r3-abort-0", "status": "aborted"})


def _timeline_on(*chunks: bytes) -> EngineTimeline:
    """The lines through the log parser into a timeline, as the agent reads them."""
    parser, tl = LogLineParser(SourceHealth("vllm_log")), EngineTimeline()
    for chunk in chunks:
        for line in chunk.decode().splitlines():
            tl.feed_all(parser.parse_all(line, 0.0))
    return tl


def test_a_vllm_restarted_under_a_running_agent_without_the_line_drops_the_old_budget() -> None:
    """The steps' iteration going back is a new vLLM: one started on its default budget logs no line, so the
    budget the old one announced no longer holds; one that logs its line keeps it."""
    assert (_timeline_on(BUDGET_START, TRAFFIC).token_budget_source()) == "announced"
    restarted = _timeline_on(BUDGET_START, TRAFFIC, RESTART, TRAFFIC)  # the same steps again: iteration 0 on
    assert restarted.token_budget_source() in ("inferred", "guessed") and restarted.token_budget() != 4096
    again = _timeline_on(BUDGET_START, TRAFFIC, RESTART, BUDGET_START, TRAFFIC)  # this one logged its line
    assert (again.token_budget_source(), again.token_budget()) == ("announced", 4096)
