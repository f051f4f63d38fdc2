"""The page in Debian's real headless Chromium, served by uvicorn from a replayed state with a token: it draws
the KV areas and every request's lane without a console error, and keeps the token from `?token=`. The state
holds a client's `/tokenize` call (a request vLLM never ran): it gets no lane. The axis fits the data in the time
window, `?request=` zooms to one request, and every lane label carries the full id.

With ATTRIB_UPDATE_PICTURE=1 (`make picture`) it also writes the screenshot to docs/img/page.png (the README's
picture); a plain test run leaves the work tree as it found it. Chromium is required:
scripts/setup-system.sh installs it, and this test fails (not skips) without it.
"""

from __future__ import annotations

import html
import math
import os
import re
import shutil
import socket
import struct
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn
from api_replayed import replayed, state_of
from test_api_timeline import PHANTOM, with_tokenize_call

from attrib_agent.read_model import AgentState
from attrib_agent.sinks.api.app import api_app

TOKEN = "page-test-token"
WINDOW = (1400, 1000)
README_PICTURE = Path(__file__).resolve().parents[3] / "docs" / "img" / "page.png"


def chromium() -> str:
    found = shutil.which("chromium") or shutil.which("chromium-browser")
    if found is None:
        pytest.fail("chromium not found: the page test needs Debian's chromium (scripts/setup-system.sh installs it)")
    return found


@pytest.fixture(scope="module")
def base_url() -> Iterator[str]:
    yield from serve(state_of(with_tokenize_call("preempt")))


def serve(state: AgentState) -> Iterator[str]:
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = api_app(state, token=TOKEN)
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    for _ in range(200):
        if server.started:
            break
        thread.join(0.05)
    assert server.started, "uvicorn did not start"
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    thread.join(10)
    sock.close()


def run_chromium(tmp_path: Path, url: str, *mode: str) -> tuple[str, list[str]]:
    """Load `url` until the page settles; returns stdout and the console lines Chromium logged."""
    args = [chromium(), "--headless", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
            f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WINDOW[0]},{WINDOW[1]}",
            "--enable-logging=stderr", "--v=0", "--virtual-time-budget=10000", *mode, url]
    if os.geteuid() == 0:
        args.insert(1, "--no-sandbox")  # Chromium refuses to sandbox as root (CI containers)
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    return done.stdout, [line for line in done.stderr.splitlines() if ":CONSOLE" in line]


def test_page_draws_lanes_and_kv_without_console_errors(tmp_path: Path, base_url: str) -> None:
    dom, console = run_chromium(tmp_path, f"{base_url}/?token={TOKEN}", "--dump-dom")
    assert console == []
    assert 'data-state="drawn"' in dom
    pipeline = replayed("preempt")
    lanes = re.findall(r'<g class="lane[^"]*" data-request-id="([^"]+)"', dom)
    assert sorted(html.unescape(x) for x in lanes) == sorted(lc.request_id for lc in pipeline.timeline.lifecycles())
    assert PHANTOM not in dom and "tokenize-" not in dom
    whale_areas = re.findall(r'class="kv-area whale" data-request-id="([^"]+)"', dom)
    assert set(whale_areas) == {r.request_id for r in pipeline.store if r.is_whale}
    assert dom.count('class="wait"') >= 10  # the shorts queued behind the whales
    assert dom.count('class="culprit-link"') >= 1 and "Slowed by" in dom
    assert dom.count('class="preempted"') == len(pipeline.timeline.preemptions())
    assert 'data-clipped-labels="0"' in dom


def test_lanes_cap_keeps_whales_and_the_most_slowed(tmp_path: Path, base_url: str) -> None:
    dom, console = run_chromium(tmp_path, f"{base_url}/?token={TOKEN}&lanes=8", "--dump-dom")
    assert console == []
    lanes = {html.unescape(x) for x in re.findall(r'<g class="lane[^"]*" data-request-id="([^"]+)"', dom)}
    results = list(replayed("preempt").store)
    worst = max((r for r in results if not r.is_whale), key=lambda r: r.ttft_slowdown_s)
    assert len(lanes) == 8 and {r.request_id for r in results if r.is_whale} | {worst.request_id} <= lanes
    assert "Lanes for 8 of 23 requests" in dom


def test_page_without_token_says_how_to_give_one(tmp_path: Path, base_url: str) -> None:
    dom, _ = run_chromium(tmp_path, f"{base_url}/", "--dump-dom")
    assert 'data-state="unauthorized"' in dom and "/?token=" in dom
    assert 'class="lane' not in dom


def test_screenshot(tmp_path: Path, base_url: str) -> None:
    shot = tmp_path / "page.png"
    _, console = run_chromium(tmp_path, f"{base_url}/?token={TOKEN}", f"--screenshot={shot}")
    assert console == []
    png = shot.read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    assert struct.unpack(">II", png[16:24]) == WINDOW
    assert len(png) > 50_000  # a drawn page, not a blank one
    if os.environ.get("ATTRIB_UPDATE_PICTURE") == "1" and (
            not README_PICTURE.exists() or README_PICTURE.read_bytes() != png):
        README_PICTURE.parent.mkdir(parents=True, exist_ok=True)
        README_PICTURE.write_bytes(png)


def axis(dom: str) -> tuple[float, float]:
    m = re.search(r'<svg [^>]*data-t0="([^"]+)" data-t1="([^"]+)"', dom)
    assert m is not None, "no chart drawn"
    return float(m.group(1)), float(m.group(2))


def test_axis_fits_the_data_in_the_window(tmp_path: Path, base_url: str) -> None:
    p = replayed("preempt")
    lcs = list(p.timeline.lifecycles())
    steps = [si for si, _ in p.timeline.outcomes()]
    first = min(min(lc.arrival_ts or math.inf for lc in lcs), steps[0].start_ts)
    last = max(max(lc.end_ts or 0.0 for lc in lcs), steps[-1].end_ts)
    t0, t1 = axis(run_chromium(tmp_path, f"{base_url}/?token={TOKEN}", "--dump-dom")[0])
    assert (t0, t1) == pytest.approx((first, last), abs=1e-3)  # the phantom does not stretch it
    window = (steps[-1].end_ts - steps[0].end_ts) / 2  # the last half: the axis starts at its start
    dom, console = run_chromium(tmp_path, f"{base_url}/?token={TOKEN}&window={window!r}", "--dump-dom")
    assert console == []
    t0, t1 = axis(dom)
    assert t0 == pytest.approx(steps[-1].end_ts - window, abs=1e-3) and t1 == pytest.approx(last, abs=1e-3)
    shown = {html.unescape(x) for x in re.findall(r'<g class="lane[^"]*" data-request-id="([^"]+)"', dom)}
    assert shown == {lc.request_id for lc in lcs if lc.end_ts is None or lc.end_ts >= t0}
    assert len(shown) < len(lcs)
    assert '<option value="2m">last 2m</option>' in dom


def test_request_param_zooms_to_that_request(tmp_path: Path, base_url: str) -> None:
    p = replayed("preempt")
    worst = max((r for r in p.store if not r.is_whale), key=lambda r: r.ttft_slowdown_s)
    lc = next(lc for lc in p.timeline.lifecycles() if lc.request_id == worst.request_id)
    assert lc.arrival_ts is not None and lc.end_ts is not None
    dom, console = run_chromium(tmp_path, f"{base_url}/?token={TOKEN}&request={lc.request_id}", "--dump-dom")
    assert console == []
    t0, t1 = axis(dom)
    pad = max((lc.end_ts - lc.arrival_ts) / 6, 0.2)
    assert (t0, t1) == pytest.approx((lc.arrival_ts - pad, lc.end_ts + pad), abs=1e-3)
    focused = re.findall(r'<g class="lane[^"]*focused[^"]*" data-request-id="([^"]+)"', dom)
    assert [html.unescape(x) for x in focused] == [lc.request_id]
    shown = {html.unescape(x) for x in re.findall(r'<g class="lane[^"]*" data-request-id="([^"]+)"', dom)}
    overlapping = {o.request_id for o in p.timeline.lifecycles() if o.arrival_ts is not None and o.arrival_ts <= t1
                   and (o.end_ts is None or o.end_ts >= t0)}
    assert shown == overlapping and "Zoomed to " + lc.request_id in html.unescape(dom)
    assert "Slowed by" in dom  # its culprits are shown too


def test_lane_labels_carry_the_full_id(tmp_path: Path, base_url: str) -> None:
    dom, _ = run_chromium(tmp_path, f"{base_url}/?token={TOKEN}", "--dump-dom")
    labels = re.findall(r'<text [^>]*class="lane-label[^"]*"[^>]*>([^<]*)<title>([^<]*)</title></text>', dom)
    ids = {lc.request_id for lc in replayed("preempt").timeline.lifecycles()}
    assert {html.unescape(full) for _, full in labels} == ids
    assert all(len(short) <= 24 for short, _ in labels)


@pytest.fixture(scope="module")
def bench_url() -> Iterator[str]:
    yield from serve(state_of(replayed("bench-mixed")))


def test_blame_labels_fit_and_carry_the_full_culprit_id(tmp_path: Path, bench_url: str) -> None:
    """`vllm bench serve` ids (`cmpl-bench-<tag>-<n>-0`), and culprits with no lane of their own: the label
    right of a slowed request's lane (`+18.5 s <- culprit`) ran past the chart's edge. It is cut to its column, with
    the full id on hover; the page counts the labels drawn outside their column (getBBox in Chromium)."""
    dom, console = run_chromium(tmp_path, f"{bench_url}/?token={TOKEN}&window=5m", "--dump-dom")
    assert console == []
    assert 'data-clipped-labels="0"' in dom
    labels = re.findall(r'<text [^>]*class="victim-label"[^>]*>([^<]*)<title>([^<]*)</title></text>', dom)
    assert labels
    culprits = {c.request_id for r in replayed("bench-mixed").store for c in r.culprits}
    for shown, full in labels:
        head, _, culprit = html.unescape(full).partition(" ← ")
        assert culprit in culprits and html.unescape(shown).startswith(head + " ← "), (shown, full)
        assert len(html.unescape(shown)) < len(head) + 3 + len(culprit)  # the bench ids are cut


def test_shared_prefix_blocks_are_drawn_once(tmp_path: Path) -> None:
    """bench-prefix (3 prefixes shared by 60 requests): one `kv-shared` band under the requests' own blocks, a
    legend entry for it, and the stack's top no higher than the ledger's blocks in use (each block once)."""
    served = serve(state_of(replayed("bench-prefix")))
    url = next(served)
    try:
        dom, console = run_chromium(tmp_path, f"{url}/?token={TOKEN}", "--dump-dom")
    finally:
        next(served, None)
    assert console == [] and 'data-state="drawn"' in dom
    assert dom.count('class="kv-shared"') == 1 and "shared prefix blocks (counted once)" in dom
    assert 'data-request-id="shared prefix"' not in dom  # the band is nobody's lane or area


def test_a_cut_response_draws_from_its_first_step_not_from_the_lanes_before_it(tmp_path: Path, base_url: str) -> None:
    """nu17's GuideLLM run (a step every 3-5 ms): the page's last 2 minutes came back as the newest 2,000 steps
    (10 s), and the axis began at the arrival of the requests already decoding at the first of them, so the KV area
    read 0 blocks for their first 1.9 s, which the response simply did not hold. A cut response's axis starts at
    its first step (`since`); a request that arrived earlier is cut, as at a window's start."""
    from attrib_agent.sinks.api.timeline import timeline_json

    p = replayed("preempt")
    d = timeline_json(state_of(p), None, None, max_steps=300)
    assert d["truncated"] and d["next_since"] is None  # the newest 300 steps: cut at the start
    assert min(r["arrival_ts"] for r in d["requests"]) < d["since"] - 1.0  # lanes from well before the first step
    dom, console = run_chromium(tmp_path, f"{base_url}/?token={TOKEN}&window=all&max_steps=300", "--dump-dom")
    assert console == [] and "bounded response" in dom
    t0, t1 = axis(dom)
    assert t0 == pytest.approx(d["since"], abs=1e-3) and t1 == pytest.approx(d["until"], abs=1e-3)
