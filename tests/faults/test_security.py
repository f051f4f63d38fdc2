"""Security of the live agent over its real sockets: loopback by default, the bearer token on every data
endpoint, request ids that are huge, malformed or path-like refused without a 500, and the `canary` recording's
prompt text (vLLM at DEBUG with --enable-log-outputs) in none of the agent's outputs: its own log, the spans it
exports, /metrics, any API answer, the journal. One agent serves the whole module."""

from __future__ import annotations

import argparse
import contextlib
import gzip
import http.client
import os
import shutil
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from attrib_agent.config.load import add_run_arguments, load_config
from attrib_agent.lab.server import stop_group
from attrib_agent.lab.span_sink import SpanSink
from attrib_agent.recording import OTLP, Recording, otlp_body

from .harness import AGENT_BIN, RECORDINGS, AgentProcess, Feed, LogWriter, StandInVllm, free_port, recorded, wait_until

TOKEN = "tok-3c1f9a7e5b2d"
PASSWORD = "pw-9d2e41b7"  # in --vllm-url's userinfo: must never reach the agent's log
DATA_PATHS = ("/v1/culprits/top", "/v1/timeline", "/metrics", "/v1/requests/x/culprits", "/v1/nonexistent",
              "/page/nonexistent.js")


@dataclass
class Secured:
    agent: AgentProcess
    collector: SpanSink
    journal: Path
    log_file: Path
    canary: str
    ids: tuple[str, ...]


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Secured]:
    root = tmp_path_factory.mktemp("secured")
    rec = recorded("canary")
    stand_in = StandInVllm(rec)
    writer = LogWriter(root / "vllm.log")
    collector = SpanSink().start()
    port = free_port()
    agent = AgentProcess(root / "agent", f"http://scraper:{PASSWORD}@127.0.0.1:{stand_in.port}", writer.path,
                         journal_dir=root / "journal", otlp_export=collector.url,
                         token=TOKEN, api_port=port, extra_args=("--log-level", "DEBUG"))
    try:
        agent.start()
        Feed(rec, writer, stand_in, agent.otlp_url).start().join(60)
        agent.wait_final(rec.span_ids)
        yield Secured(agent, collector, root / "journal", writer.path, str(rec.meta["canary"]), rec.span_ids)
    finally:
        agent.stop()
        collector.close()
        stand_in.stop()
        writer.close()


def listening_addresses(pid: int) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket the process listens on, from /proc (IPv4 and IPv6, its namespace)."""
    inodes = set()
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            target = os.readlink(f"/proc/{pid}/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    out = set()
    for table, v6 in ((f"/proc/{pid}/net/tcp", False), (f"/proc/{pid}/net/tcp6", True)):
        for line in Path(table).read_text().splitlines()[1:]:
            cols = line.split()
            if cols[3] != "0A" or cols[9] not in inodes:  # 0A: LISTEN
                continue
            hexaddr, hexport = cols[1].split(":")
            raw = bytes.fromhex(hexaddr)
            if v6:
                addr = ":".join(raw[i:i + 4][::-1].hex() for i in range(0, 16, 4))
            else:
                addr = ".".join(str(b) for b in raw[::-1])
            out.add((addr, int(hexport, 16)))
    return out


def test_api_and_receivers_listen_on_loopback_only_by_default(tmp_path: Path) -> None:
    """No --listen, --otlp-bind or port flag at all: the defaults (9400, 4317, 4318) in a network namespace of
    its own, so they clash with nobody on this machine."""
    if shutil.which("unshare") is None or subprocess.run(["unshare", "-n", "true"], capture_output=True).returncode:
        pytest.skip("cannot make a network namespace here (unshare -n)")
    out = (tmp_path / "agent.out").open("wb")
    proc = subprocess.Popen(["unshare", "-n", str(AGENT_BIN), "run", "--vllm-url", "http://127.0.0.1:8000",
                             "--log-file", str(tmp_path / "vllm.log"), "--no-nvml"],
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if not k.startswith(("ATTRIB_", "OTEL_"))})
    try:
        def three() -> set[tuple[str, int]] | None:
            assert proc.poll() is None, (tmp_path / "agent.out").read_text()
            addrs = listening_addresses(proc.pid)
            return addrs if len(addrs) >= 3 else None

        addrs = wait_until(three, 30, "the agent's three listening sockets",
                           detail=lambda: (tmp_path / "agent.out").read_text())
        assert addrs == {("127.0.0.1", 9400), ("127.0.0.1", 4317), ("127.0.0.1", 4318)}, addrs
    finally:
        stop_group(proc)
        out.close()
    parser = argparse.ArgumentParser()
    add_run_arguments(parser)
    cfg = load_config(parser.parse_args(["--vllm-url", "http://127.0.0.1:8000"]), {})
    assert (cfg.listen_host, cfg.listen_port, cfg.otlp_bind) == ("127.0.0.1", 9400, "127.0.0.1")


def test_the_agent_under_test_listens_on_loopback_only(secured: Secured) -> None:
    agent = secured.agent
    assert agent.proc is not None
    addrs = listening_addresses(agent.proc.pid)
    assert addrs == {("127.0.0.1", agent.api_port), ("127.0.0.1", agent.otlp_port)}, addrs


def test_every_data_endpoint_needs_the_token_and_the_probes_do_not(secured: Secured) -> None:
    url = secured.agent.api_url
    rid = secured.ids[0]
    with httpx.Client(trust_env=False, timeout=10) as c:
        for path in (*DATA_PATHS, f"/v1/requests/{rid}/culprits"):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {TOKEN}"},
                            {"Authorization": TOKEN}, {"Authorization": f"Bearer {TOKEN}x"}):
                r = c.get(url + path, headers=headers)
                assert r.status_code == 401, (path, headers, r.status_code)
                assert rid not in r.text and "cmpl-" not in r.text
        good = {"Authorization": f"bearer {TOKEN}"}  # the scheme is case-insensitive
        assert c.get(f"{url}/v1/requests/{rid}/culprits", headers=good).status_code == 200
        assert c.get(f"{url}/metrics", headers=good).status_code == 200
        assert c.get(f"{url}/v1/nonexistent", headers=good).status_code == 404
        for probe in ("/healthz", "/readyz"):
            assert c.get(url + probe).status_code == 200
        # The page's static shell is open by design (a browser cannot add a header when it navigates); it
        # must hold no data: the same bytes whatever the agent knows, and no request id.
        for shell in ("/", "/page/page.js"):
            r = c.get(url + shell)
            assert r.status_code == 200 and rid not in r.text
    assert TOKEN not in secured.agent.output()


BAD_IDS = (
    "..", ".", "a..b", "cmpl-x..", "..%2F..%2Fetc%2Fpasswd", "%2e%2e", "%2E%2E%2F%2E%2E", "..%5C..%5Cwindows",
    "a%2Fb", "%2F",
    "%00", "cmpl-x%00", "%0d%0aSet-Cookie:%20x", "%ff%fe", "%E2%80%AE", "%20", "a%20b", "a;b", "*", "%25",
    "'%20OR%201=1", "<script>", "%3Cscript%3E", "x" * 257, "cmpl-" + "9" * 5000, "a" * 60_000,
)


def raw_get(port: int, path: str, token: str | None = TOKEN) -> tuple[int, bytes]:
    """GET exactly this path over a plain socket: no client-side normalising of dot segments or escapes."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.putrequest("GET", path, skip_accept_encoding=True)
        if token:
            conn.putheader("Authorization", f"Bearer {token}")
        conn.endheaders()
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


@pytest.mark.parametrize("token", [TOKEN, None], ids=["with_token", "without_token"])
def test_huge_malformed_and_path_like_ids_get_4xx_never_500(secured: Secured, token: str | None) -> None:
    agent = secured.agent
    answers = {}
    for bad in BAD_IDS:
        for path in (f"/v1/requests/{bad}/culprits", f"/v1/requests/{bad}", f"/v1/requests/{bad}/culprits/..",
                     f"/v1/requests/../../{bad}/culprits"):
            status, body = raw_get(agent.api_port, path, token)
            answers[path] = status
            assert status < 500, (path[:200], status, body[:200])
            assert len(body) < 2048 and b"Traceback" not in body
            if token is None:
                assert status in (400, 401, 404, 414, 431), (path[:200], status)
            else:
                assert status in (400, 404, 414, 431), (path[:200], status)
    if token is not None:  # the id checks really ran: the culprits route refused the bad ids themselves
        assert answers["/v1/requests/../culprits"] == 400 and answers["/v1/requests/%2e%2e/culprits"] == 400
        assert answers["/v1/requests/a..b/culprits"] == 400 and answers["/v1/requests/cmpl-x../culprits"] == 400
        assert answers[f"/v1/requests/{'x' * 257}/culprits"] == 400
        assert answers[f"/v1/requests/{'a' * 60_000}/culprits"] in (400, 414, 431)
    assert agent.healthy()
    out = agent.output()
    assert "Traceback" not in out


def test_canary_prompt_text_appears_in_no_output(secured: Secured) -> None:
    canary, agent = secured.canary, secured.agent
    fed = secured.log_file.read_text()
    assert fed.count(canary) >= 8  # the agent really was given the prompts
    # ... and vLLM's generated output (structured output made it start with the canary) ...
    assert sum(canary in x for x in fed.splitlines() if "Generated response" in x) >= 2
    # ... and the canary inside vLLM's spans (the client's W3C tracestate, which vLLM keeps on its span)
    fed_spans = [otlp_body(r) for r in Recording(RECORDINGS / "canary").records(OTLP)]
    assert sum(b.count(canary.encode()) for b in fed_spans) >= 4
    assert agent.metrics().value("attrib_source_skipped_total", source="vllm_log", kind="content_dropped") >= 8
    # the slowed canary requests' attrib.slowdown spans (the SDK's batch processor sends them within seconds)
    wait_until(lambda: secured.collector.bodies, 30, "the agent's spans at the collector")
    outputs: dict[str, bytes] = {"agent log": agent.output().encode()}
    for i, body in enumerate(secured.collector.bodies):
        outputs[f"exported spans {i}"] = gzip.decompress(body) if body[:2] == b"\x1f\x8b" else body
    with httpx.Client(trust_env=False, timeout=10, headers=agent.headers()) as c:
        url = agent.api_url
        outputs["metrics"] = c.get(f"{url}/metrics").content
        outputs["metrics openmetrics"] = c.get(f"{url}/metrics",
                                               headers={"Accept": "application/openmetrics-text"}).content
        for rid in secured.ids:
            outputs[f"culprits {rid}"] = c.get(f"{url}/v1/requests/{rid}/culprits").content
        for q in ({"window": "1h"}, {"window": "5m", "limit": "100"}):
            outputs[f"top {q}"] = c.get(f"{url}/v1/culprits/top", params=q).content
        outputs["timeline"] = c.get(f"{url}/v1/timeline").content
        outputs["timeline all"] = c.get(f"{url}/v1/timeline", params={"since": "0", "max_steps": "10000"}).content
        for path in ("/", "/page/page.js", "/page/draw.js", "/healthz", "/readyz"):
            outputs[path] = c.get(url + path).content
    agent.stop()  # the journal's last segment is flushed and closed
    replayed = subprocess.run([str(AGENT_BIN), "replay", str(RECORDINGS / "canary"), "--json"], capture_output=True,
                              timeout=120, env={k: v for k, v in os.environ.items() if not k.startswith("ATTRIB_")})
    assert replayed.returncode == 0 and replayed.stdout.count(b'"request_id"') == len(secured.ids)
    outputs["replay --json"], outputs["replay log"] = replayed.stdout, replayed.stderr
    journal_files = [p for p in secured.journal.rglob("*") if p.is_file()]
    assert journal_files
    outputs.update({f"journal {p.name}": p.read_bytes() for p in journal_files})
    named = {rid: [n for n, v in outputs.items() if rid.encode() in v] for rid in secured.ids}
    print({rid: len(v) for rid, v in named.items()}, len(secured.collector.bodies))
    assert all(any(n.startswith("journal") for n in v) for v in named.values())  # the outputs do hold the requests
    leaked = sorted(name for name, data in outputs.items() if canary.encode() in data)
    assert not leaked
    assert PASSWORD not in outputs["agent log"].decode()
    assert "HTTP Request:" not in outputs["agent log"].decode()  # no per-scrape httpx lines (URL with password)


def test_replay_serve_honours_the_api_token_file(tmp_path: Path) -> None:
    """`replay --serve` reads the same settings as `run`: a token given as a file protects its API too."""
    token_file = tmp_path / "token"
    token_file.write_text(TOKEN + "\n")
    port = free_port()
    out = (tmp_path / "replay.out").open("wb")
    proc = subprocess.Popen([str(AGENT_BIN), "replay", str(RECORDINGS / "canary"), "--serve", "--duration", "60",
                             "--listen", f"127.0.0.1:{port}", "--api-token-file", str(token_file)],
                            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                            env={k: v for k, v in os.environ.items() if not k.startswith(("ATTRIB_", "OTEL_"))})
    try:
        url = f"http://127.0.0.1:{port}"

        def up() -> bool:
            assert proc.poll() is None, (tmp_path / "replay.out").read_text()
            with contextlib.suppress(httpx.HTTPError):
                return httpx.get(f"{url}/healthz", timeout=2, trust_env=False).status_code == 200
            return False

        wait_until(up, 30, "replay --serve to answer")
        with httpx.Client(trust_env=False, timeout=10) as c:
            assert c.get(f"{url}/v1/timeline").status_code == 401
            assert c.get(f"{url}/metrics").status_code == 401
            assert c.get(f"{url}/v1/timeline", headers={"Authorization": f"Bearer {TOKEN}"}).status_code == 200
    finally:
        stop_group(proc)
        out.close()
