"""One real vLLM server for the whole test session (start-up costs 30-50 s)."""

import os
import signal
import time
from pathlib import Path

import pytest

from attrib_agent.lab.server import LabEndpoints, VllmLab


def pytest_collection_modifyitems(items):
    for item in items:
        if "/e2e/" in str(item.fspath):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture(scope="session")
def lab(tmp_path_factory) -> LabEndpoints:
    workdir = tmp_path_factory.mktemp("lab")
    server = VllmLab(workdir=workdir)
    endpoints = server.start()
    endpoints.save(workdir / "state.json")
    try:
        yield endpoints
    finally:
        server.stop()
        # The whole process group (API server and engine core) must be gone.
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.killpg(endpoints.vllm_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.2)
        else:
            os.killpg(endpoints.vllm_pid, signal.SIGKILL)
            pytest.fail("vLLM's process group outlived VllmLab.stop()")


@pytest.fixture(scope="session")
def lab_state(lab) -> Path:
    return Path(lab.server_log).parent / "state.json"
