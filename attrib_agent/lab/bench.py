"""Record a run of a third-party load client (`vllm bench serve`) against the lab's vLLM.

Like lab/record.py, but the client is vLLM's own benchmark, run as users run it: it sends its own
`/tokenize` call (random and prefix_repetition datasets) and Poisson arrivals from its dataset. It cannot report its own
lateness, so the lab's lateness probe (lab/probe.py) runs beside it at the same priority on the same CPUs,
and a run whose probe was late while requests were in flight is retried, then rejected.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from attrib_agent import __version__
from attrib_agent.lab.cpus import client_cpus
from attrib_agent.lab.model import ensure_model_dir
from attrib_agent.lab.probe import client_place, lateness_summary
from attrib_agent.lab.record import DEFAULT_MAX_LATENESS_S, RunResult, _vllm_version, retry_until_on_time, wait_idle
from attrib_agent.lab.server import LabEndpoints, LabError, lab_home
from attrib_agent.lab.spans import request_spans_of, span_times
from attrib_agent.recording import LOG, METRICS, OTLP, Recording, RecordingWriter
from attrib_agent.sources.metrics.parser import parse_metrics

BENCH_TIMEOUT_S = 300.0
SPAN_WAIT_S = 20.0
LONG_PROMPT = 2000
RECEIVED = re.compile(r"Received request (\S+?):?\s")
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
               "NO_COLOR": "1", "PYTHONUNBUFFERED": "1"}


def bench_command(lab: LabEndpoints, prefix: str, result_dir: Path, args: Sequence[str]) -> list[str]:
    """`vllm bench serve` (through lab/vllm_cli.py) at the lab's server, tokenizer and model name."""
    model_dir = ensure_model_dir(lab_home() / "models")
    return [sys.executable, "-m", "attrib_agent.lab.vllm_cli", "bench", "serve",
            "--base-url", lab.vllm_url, "--model", lab.model, "--tokenizer", str(model_dir),
            "--request-id-prefix", prefix, "--save-result", "--save-detailed",
            "--result-dir", str(result_dir), "--result-filename", "bench.json", *args]


def _scalars(result: dict[str, Any]) -> dict[str, Any]:
    """The benchmark's summary figures only: its per-request lists hold generated text, never kept."""
    return {k: v for k, v in result.items() if isinstance(v, int | float | bool) or
            (isinstance(v, str) and len(v) < 200)}


def traffic_figures(rec: Recording, prefix: str | None = None) -> dict[str, Any]:
    """What the run sent, read back from the recording: requests (spans), the ids vLLM received that never
    produced a span (e.g. `tokenize-...`), and the prefix cache's hit share of prompt tokens over the run."""
    spans = request_spans_of(rec.records(OTLP))
    ours = {k: v for k, v in spans.items() if prefix is None or prefix in k}
    t0 = min((s.start_ts for s in ours.values()), default=0.0)
    received: list[str] = []
    for r in rec.records(LOG):
        m = RECEIVED.search(str(r.get("line", "")))
        if m:
            received.append(m.group(1))
    hits: list[float] = []
    queries: list[float] = []
    for r in rec.records(METRICS):
        for s in parse_metrics(str(r.get("text", "")), float(r["ts"])):
            if s.prefix_cache_hits_total is not None and s.prefix_cache_queries_total is not None:
                hits.append(s.prefix_cache_hits_total)
                queries.append(s.prefix_cache_queries_total)
    q = queries[-1] - queries[0] if queries else 0.0
    h = hits[-1] - hits[0] if hits else 0.0
    return {
        "requests": len(ours),
        "duration_s": round(max(s.end_ts for s in ours.values()) - t0, 3) if ours else 0.0,
        "prompt_tokens_max": max((s.prompt_tokens or 0 for s in ours.values()), default=0),
        # Arrival offsets of the long prompts (>= LONG_PROMPT tokens): whales arriving mid-stream or not.
        "long_prompts_at_s": sorted(round(s.start_ts - t0, 2) for s in ours.values()
                                    if (s.prompt_tokens or 0) >= LONG_PROMPT),
        "received_without_span": sorted(set(received) - set(spans)),
        "prefix_cache_queries": q, "prefix_cache_hits": h, "prefix_hit_share": round(h / q, 4) if q else 0.0,
    }


@dataclass(frozen=True)
class Companion:
    """A second `vllm bench serve` started `delay_s` after the measured one, at normal priority: another
    user's traffic arriving mid-stream (e.g. whales), with its own `/tokenize` call (random dataset)."""

    delay_s: float
    args: tuple[str, ...]


def whale_companion(delay_s: float, count: int, seed: int, prompt_tokens: int = 3900,
                    output_tokens: int = 300) -> Companion:
    """`count` long random-dataset prompts (+-20 %) from a second client: whales arriving mid-stream."""
    return Companion(delay_s, ("--dataset-name", "random", "--random-input-len", str(prompt_tokens),
                               "--random-output-len", str(output_tokens), "--random-range-ratio", "0.2",
                               "--num-prompts", str(count), "--request-rate", "0.2", "--seed", str(seed),
                               "--ignore-eos", "--disable-tqdm"))


def _start_companions(lab: LabEndpoints, run_id: str, tmp: Path,
                      companions: Sequence[Companion]) -> list[tuple[Companion, subprocess.Popen[bytes], Path]]:
    started = []
    t0 = time.monotonic()
    for i, c in enumerate(sorted(companions, key=lambda c: c.delay_s)):
        time.sleep(max(0.0, t0 + c.delay_s - time.monotonic()))
        d = tmp / f"companion{i}"
        d.mkdir()
        cmd = bench_command(lab, f"{run_id}c{i}-", d, c.args)
        started.append((c, subprocess.Popen(cmd, env={**os.environ, **OFFLINE_ENV}, stdout=subprocess.PIPE,
                                            stderr=subprocess.STDOUT), d))
    return started


def _attempt(lab: LabEndpoints, out: Path, args: Sequence[str], meta: dict[str, Any],
             companions: Sequence[Companion] = (), watch: Callable[[str], None] | None = None) -> RunResult:
    run_id = f"bench-{secrets.token_hex(3)}"  # in every request id of the run; companions' are "<run_id>c<i>-"
    prefix = f"{run_id}-"
    if watch is not None:
        watch(prefix)
    before = wait_idle(lab)
    cpus = client_cpus(lab.vllm_pid)
    http = httpx.Client(timeout=10.0, trust_env=False)
    started = time.time()
    http.post(f"{lab.capture_url}/lab/start", json={"dir": str(out), "meta": meta}).raise_for_status()
    try:
        with tempfile.TemporaryDirectory() as tmp:
            probe_out = Path(tmp) / "probe.json"
            probe = subprocess.Popen([sys.executable, "-m", "attrib_agent.lab.probe", str(probe_out),
                                      *map(str, cpus or [])])
            others: list[tuple[Companion, subprocess.Popen[bytes], Path]] = []
            try:
                cmd = bench_command(lab, prefix, Path(tmp), args)
                proc = subprocess.Popen(cmd, env={**os.environ, **OFFLINE_ENV}, preexec_fn=lambda: client_place(cpus),
                                        stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
                others = _start_companions(lab, run_id, Path(tmp), companions)
                runs = [(proc, Path(tmp)), *((p, d) for _, p, d in others)]
                results = [_finish(p, d) for p, d in runs]
            finally:
                for p in [proc, *(p for _, p, _ in others)]:
                    if p.poll() is None:
                        p.kill()
                probe.terminate()
                probe.wait(timeout=30)
            probe_data = json.loads(probe_out.read_text())
        result = results[0]
        expected = sum(int(r.get("completed", 0)) for r in results)
        times = _wait_spans(out, run_id, expected)
        # vLLM's prefix_repetition dataset ignores --request-id-prefix: then the run's requests are the last
        # `completed` to arrive (the recording holds this run only; `--ready-check-timeout-sec` would add one first).
        named = {k: v for k, v in times.items() if run_id in k}
        mine = ([t for rid, t in named.items() if prefix in rid] if named else
                sorted(times.values())[-int(result.get("completed", 0)):] if result.get("completed") else [])
        after = wait_idle(lab)
    finally:
        counts = http.post(f"{lab.capture_url}/lab/stop").json()
        http.close()
    # Lateness counts while the measured client has requests in flight (not its own summing-up afterwards).
    start = min((s for s, _ in mine), default=started) - 0.05
    end = max((e for _, e in mine), default=time.time())
    lateness = {**lateness_summary(probe_data["samples"], start, end),
                **{k: probe_data[k] for k in ("scheduling_policy", "scheduling_priority", "cpus")}}
    rec = Recording(out)
    run_meta = {
        "run_tag": run_id, "request_id_prefix": prefix, "started_ts": started, "start_ts": start,
        "ended_ts": time.time(),
        "client_lateness": lateness, "stream_counts": counts, "bench_result": _scalars(result),
        "companions": [{"delay_s": c.delay_s, "args": list(c.args), "bench_result": _scalars(r)}
                       for c, r in zip(companions, results[1:], strict=True)],
        "block_size": after.block_size, "num_gpu_blocks": after.num_gpu_blocks,
        "preemptions": after.preemptions - before.preemptions,
        "spans_expected": expected, "spans_seen": len(named or times),
        "traffic": traffic_figures(rec, run_id if named else None),
    }
    with RecordingWriter(out, merge_existing=True) as w:
        w.update_meta(run_meta)
    return RunResult(out, Recording(out).meta, [])


def _finish(proc: subprocess.Popen[bytes], result_dir: Path) -> dict[str, Any]:
    """Wait for one `vllm bench serve`; its saved result (raises with its output's tail if it failed)."""
    out, _ = proc.communicate(timeout=BENCH_TIMEOUT_S)
    if proc.returncode != 0:
        raise LabError(f"vllm bench serve failed with code {proc.returncode}:\n" + out.decode(errors="replace")[-3000:])
    result: dict[str, Any] = json.loads((result_dir / "bench.json").read_text())
    return result


def _wait_spans(out: Path, run_id: str, expected: int) -> dict[str, tuple[float, float]]:
    deadline = time.monotonic() + SPAN_WAIT_S
    while True:
        times = span_times(out / "otlp.jsonl")
        named = sum(run_id in k for k in times)
        if (named or len(times)) >= expected or time.monotonic() > deadline:
            return times
        time.sleep(0.5)


def record_bench(lab: LabEndpoints, out: Path, args: Sequence[str], *, command: str = "",
                 dataset: dict[str, Any] | None = None, max_lateness_s: float = DEFAULT_MAX_LATENESS_S,
                 attempts: int = 3, compress: bool = True, companions: Sequence[Companion] = (),
                 watch: Callable[[str], None] | None = None) -> RunResult:
    """Record `vllm bench serve ARGS` into `out`, retrying a run whose probe was late; raise if all were.

    `watch(prefix)` is called before each attempt with the prefix of its request ids (vLLM's ids are
    `cmpl-<prefix><index>-0`), so a test can follow the run's requests while it goes."""
    if out.exists() and any(out.iterdir()):
        raise LabError(f"{out} exists and is not empty; refusing to overwrite a recording")
    meta = {
        "created_by": f"attrib-agent {__version__}", "command": command or " ".join(sys.argv),
        "vllm_version": _vllm_version(), "model": {"name": lab.model, "kv_cache_bytes": lab.kv_cache_bytes},
        "vllm_args": lab.vllm_args, "client": {"name": "vllm bench serve", "args": list(args)},
        "dataset": dataset, "max_lateness_s": max_lateness_s,
    }
    ordered = sorted(companions, key=lambda c: c.delay_s)
    return retry_until_on_time(lambda n: _attempt(lab, out, args, {**meta, "attempt": n}, ordered, watch), out,
                               "vllm bench serve (the probe's lateness)", max_lateness_s=max_lateness_s,
                               attempts=attempts, compress=compress)
