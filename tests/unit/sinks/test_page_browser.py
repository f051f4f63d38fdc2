"""The page in Debian's real headless Chromium, served by uvicorn from a replayed state with a token: it draws
the KV areas and every request's lane without a console error, and keeps the token from `?token=`.

Writes the screenshot to docs/img/page.png (the README's picture) when it changed. Chromium is required:
scripts/setup-system.sh installs it, and this test fails (not skips) without it.
"""

from __future__ import annotations

import html
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
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    app = api_app(state_of(replayed("preempt")), token=TOKEN)
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
    whale_areas = re.findall(r'class="kv-area whale" data-request-id="([^"]+)"', dom)
    assert set(whale_areas) == {r.request_id for r in pipeline.store if r.is_whale}
    assert dom.count('class="wait"') >= 10  # the shorts queued behind the whales
    assert dom.count('class="culprit-link"') >= 1 and "Slowed by" in dom
    assert dom.count('class="preempted"') == len(pipeline.timeline.preemptions())


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
    if not README_PICTURE.exists() or README_PICTURE.read_bytes() != png:
        README_PICTURE.parent.mkdir(parents=True, exist_ok=True)
        README_PICTURE.write_bytes(png)
