"""The capture process's HTTP side, driven over a real loopback socket."""

import base64
import os
import threading
from http.server import ThreadingHTTPServer

import httpx
import pytest

from attrib_agent.lab.capture import MAX_OTLP_BODY, Capture, make_handler
from attrib_agent.recording import LOG, OTLP, Recording, log_record
from attrib_agent.sources.log.pipe import LOG_PIPE_BYTES, widen_pipe


@pytest.fixture
def capture_server(tmp_path):
    cap = Capture(tmp_path / "server.log")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(cap))
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    yield cap, f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


def test_otlp_bodies_are_recorded_raw_only_while_recording(capture_server, tmp_path, otlp_export_body):
    cap, url = capture_server
    with httpx.Client(trust_env=False) as c:
        # Before a recording is open: acknowledged, counted, not written anywhere.
        r = c.post(f"{url}/v1/traces", content=otlp_export_body, headers={"Content-Type": "application/x-protobuf"})
        assert r.status_code == 200 and r.headers["content-type"] == "application/x-protobuf"
        assert c.post(f"{url}/lab/start", json={"dir": str(tmp_path / "rec"), "meta": {"k": 1}}).status_code == 200
        c.post(f"{url}/v1/traces", content=otlp_export_body, headers={"Content-Type": "application/x-protobuf"})
        cap.record(LOG, log_record(1.0, "a vLLM line"))
        counts = c.post(f"{url}/lab/stop").json()
        status = c.get(f"{url}/lab/status").json()
    assert counts == {OTLP: 1, LOG: 1}
    assert status["otlp_requests"] == 2 and status["recording"] is False
    rec = Recording(tmp_path / "rec")
    assert rec.meta["k"] == 1
    (otlp,) = list(rec.records(OTLP))
    assert base64.b64decode(otlp["body_b64"]) == otlp_export_body
    assert otlp["content_type"] == "application/x-protobuf"


def test_oversized_body_is_refused_with_413(capture_server):
    cap, url = capture_server
    with httpx.Client(trust_env=False) as c:
        r = c.post(f"{url}/v1/traces", content=b"\0" * (MAX_OTLP_BODY + 1))
    assert r.status_code == 413
    assert cap.counters["otlp_rejected"] == 1


def test_unknown_path_is_404(capture_server):
    _, url = capture_server
    with httpx.Client(trust_env=False) as c:
        assert c.get(f"{url}/nope").status_code == 404
        assert c.post(f"{url}/nope", content=b"x").status_code == 404


def test_forward_sends_bodies_on_unchanged(capture_server, tmp_path, otlp_export_body):
    cap, url = capture_server
    down = Capture(tmp_path / "down.log")
    httpd = ThreadingHTTPServer(("127.0.0.1", 0), make_handler(down))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        down.start(str(tmp_path / "down"), {})
        with httpx.Client(trust_env=False) as c:
            c.post(f"{url}/lab/forward", json={"url": f"http://127.0.0.1:{httpd.server_address[1]}/v1/traces"})
            c.post(f"{url}/v1/traces", content=otlp_export_body, headers={"Content-Type": "application/x-protobuf"})
        import time

        deadline = time.monotonic() + 10
        while down.counters["otlp_requests"] < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
        down.stop()
    finally:
        httpd.shutdown()
    (rec,) = list(Recording(tmp_path / "down").records(OTLP))
    assert base64.b64decode(rec["body_b64"]) == otlp_export_body


def test_widened_log_pipe_takes_what_a_default_pipe_would_block_on(tmp_path):
    """vLLM's API server writes its log into this pipe from its event loop: a full pipe stalls it (see the
    module's docstring), so the capture widens it. A default pipe takes only 64 KiB without a reader."""
    burst = b"x" * (256 * 1024)  # ~2 s of the lab's per-iteration log
    for widen in (False, True):
        r, w = os.pipe()
        try:
            size = widen_pipe(r) if widen else None
            os.set_blocking(w, False)
            written = os.write(w, burst)
        finally:
            os.close(r)
            os.close(w)
        if widen:
            assert size is not None and size >= LOG_PIPE_BYTES and written == len(burst)
        else:
            assert written < len(burst)


def test_widen_pipe_leaves_what_is_no_pipe_alone(tmp_path):
    with open(tmp_path / "f", "w") as f:
        assert widen_pipe(f.fileno()) is None


def test_recording_meta_names_the_log_pipe_size(capture_server, tmp_path):
    cap, url = capture_server
    cap.log_pipe_bytes = LOG_PIPE_BYTES
    with httpx.Client(trust_env=False) as c:
        c.post(f"{url}/lab/start", json={"dir": str(tmp_path / "rec"), "meta": {}}).raise_for_status()
        assert c.get(f"{url}/lab/status").json()["log_pipe_bytes"] == LOG_PIPE_BYTES
        c.post(f"{url}/lab/stop")
    assert Recording(tmp_path / "rec").meta["log_pipe_bytes"] == LOG_PIPE_BYTES


def test_each_recording_opens_with_vllms_token_budget_line(tmp_path):
    """vLLM names its step budget once, at start-up (recorded: tests/fixtures/vllm-startup/budget-4096.log); every
    recording starts with that line, as an agent reading vLLM's log from its start would have it."""
    import io
    import pathlib

    from attrib_agent.lab.capture import read_log

    startup = pathlib.Path(__file__).parents[1] / "fixtures" / "vllm-startup" / "budget-4096.log"
    cap = Capture(tmp_path / "server.log")
    read_log(cap, io.BytesIO(startup.read_bytes()))
    for name in ("a", "b"):
        cap.start(str(tmp_path / name), {})
        cap.record(LOG, log_record(2e9, "(APIServer pid=1) INFO 2026-11-27 05:15:14.755 [x.py:1] later line"))
        cap.stop()
        lines = [r["line"] for r in Recording(tmp_path / name).records(LOG)]
        assert len(lines) == 2 and "max_num_batched_tokens=4096." in lines[0] and "later line" in lines[1]


def _plugin_steps(rec_dir):
    """What the capture recorded of the plugin's step messages (their `iter`), from the real recording."""
    from attrib_agent.recording import VLLM_STEPS

    return [m["iter"] for m in Recording(rec_dir).records(VLLM_STEPS)]


def test_closing_a_recording_waits_for_the_plugins_report_of_the_logs_last_step(tmp_path, monkeypatch):
    """The plugin's messages come later than vLLM's log on a busy host (its sender queues them and waits for room
    in a 10-datagram receiver queue): a recording closed as soon as vLLM is idle lost the log's last steps'
    messages (a CI run of the step-plugin e2e test: a logged step with no message, the preemption among the lost).
    Closing now waits until the plugin reported the last logged step, and counts a wait that ran out (a message
    the plugin dropped never comes)."""
    import io
    import json
    import socket
    import time

    from attrib_agent.lab import capture as capture_mod
    from attrib_agent.lab.capture import bind_steps_socket, read_log, receive_steps
    from attrib_agent.recording import VLLM_STEPS

    lines = [  # real lines (tests/fixtures/recordings/preempt-steps)
        "(APIServer pid=15203) INFO 2026-11-25 12:52:10.555 [loggers.py:199] Engine 000: Iteration(40): 0 context "
        "requests, 0 context tokens, 5 generation requests, 5 generation tokens, iteration elapsed time: 18.58 ms, "
        "CPU KV cache usage: 100.0%",
        "(APIServer pid=15203) INFO 2026-11-25 12:52:10.576 [loggers.py:199] Engine 000: Iteration(41): 0 context "
        "requests, 0 context tokens, 5 generation requests, 5 generation tokens, iteration elapsed time: 21.49 ms, "
        "CPU KV cache usage: 100.0%",
    ]
    path = str(tmp_path / "steps.sock")
    cap = Capture(tmp_path / "server.log")
    cap.steps_expected = True
    threading.Thread(target=receive_steps, args=(cap, bind_steps_socket(path)), daemon=True).start()
    sender = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)

    def report(it: int) -> None:
        sender.sendto(json.dumps({"v": 1, "kind": "step", "iter": it}).encode(), path)

    cap.start(str(tmp_path / "a"), {})
    read_log(cap, io.BytesIO("\n".join(lines).encode() + b"\n"))
    report(40)
    late = threading.Timer(0.3, report, args=(41,))
    late.start()
    t0 = time.monotonic()
    cap.stop()
    assert _plugin_steps(tmp_path / "a") == [40, 41]
    assert 0.25 <= time.monotonic() - t0 < capture_mod.STEPS_CATCH_UP_S
    assert cap.counters["steps_behind_at_stop"] == 0

    # A message that never comes (dropped by the plugin): the recording still closes, after the bound, counted.
    monkeypatch.setattr(capture_mod, "STEPS_CATCH_UP_S", 0.2)
    cap.start(str(tmp_path / "b"), {})
    read_log(cap, io.BytesIO(lines[1].replace("Iteration(41)", "Iteration(42)").encode() + b"\n"))
    cap.stop()
    assert cap.counters["steps_behind_at_stop"] == 1
    assert list(Recording(tmp_path / "b").records(VLLM_STEPS)) == []
    sender.close()
