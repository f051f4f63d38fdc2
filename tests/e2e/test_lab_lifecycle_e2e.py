"""Ctrl-C on `attrib-agent lab serve` stops vLLM's whole process group."""

import json
import os
import signal
import subprocess
import sys
import time

import httpx


def test_ctrl_c_stops_the_whole_process_group(tmp_path):
    state = tmp_path / "state.json"
    proc = subprocess.Popen([sys.executable, "-m", "attrib_agent", "lab", "serve", "--state-file", str(state)],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 300
        while not state.exists():
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "lab serve did not come up"
            time.sleep(0.5)
        ep = json.loads(state.read_text())
        assert httpx.get(f"{ep['vllm_url']}/health", trust_env=False).status_code == 200
        pgid = ep["vllm_pid"]
        os.kill(proc.pid, signal.SIGINT)
        assert proc.wait(timeout=60) == 130
        deadline = time.monotonic() + 15
        while True:
            try:
                os.killpg(pgid, 0)
            except ProcessLookupError:
                break
            assert time.monotonic() < deadline, "vLLM's process group survived Ctrl-C"
            time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
