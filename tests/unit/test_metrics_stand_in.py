"""The recorded /metrics stand-in treats a scraper that hangs up mid-body as vLLM's server does: counted, nothing
printed (a traceback printed from its handler thread raced `ast.parse` in another test on Python 3.11)."""

from __future__ import annotations

import socket
import struct
import time

import pytest

from attrib_agent.lab.metrics_stand_in import RecordedMetricsServer


def _hang_up_mid_body(port: int) -> None:
    s = socket.create_connection(("127.0.0.1", port))
    s.sendall(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
    s.recv(1024)  # the headers and the body's first bytes: the server is writing
    s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    s.close()


def test_a_scraper_hanging_up_is_counted_not_printed(capfd: pytest.CaptureFixture[str]) -> None:
    body = b"# a body far larger than the socket buffers\n" + b"vllm:x 1\n" * 2_000_000
    server = RecordedMetricsServer([(0.0, body)])
    try:
        for _ in range(3):
            _hang_up_mid_body(server.port)
        deadline = time.monotonic() + 10
        while server.handled()[0] < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.handled() == (3, 0)
        # still serving after it
        with socket.create_connection(("127.0.0.1", server.port)) as s:
            s.sendall(b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            reply = b""
            while chunk := s.recv(65536):  # read to the end: hanging up here would be a fourth hang-up
                reply += chunk
            assert reply.startswith(b"HTTP/1.0 404")
    finally:
        server.stop()
    assert server.handled() == (3, 0)  # kept across stop()
    err = capfd.readouterr().err
    assert "Traceback" not in err and "BrokenPipe" not in err and "ConnectionReset" not in err
