"""Overhead on vLLM (issue #7, item 1): vLLM's throughput and latency with and without the agent beside it.

    .venv/bin/python -m benchmarks.overhead                          # 3 pairs (~2.5 min with vLLM's start)
    .venv/bin/python -m benchmarks.overhead --reps 5 --max-lateness-s 1.5 --json overhead.json
    .venv/bin/python -m benchmarks.overhead --attach lab.json        # a lab from `attrib-agent lab serve`

One real vLLM (the lab's CPU build and tiny model, started once, or attached) serves one fixed scenario
(`whale2` by default: 20 shorts beside two whales that fill the KV pool and decode to the end of the run)
again and again, alternately without (A) and with (B) the agent, ABAB..., after one unmeasured warm-up run:
  B  `attrib-agent run` beside vLLM as the lab runs it (`lab/sidecar.py`, at nice 10): /metrics polled every
     100 ms, vLLM's log file tailed, vLLM's OTLP spans received (forwarded by the lab's capture process),
     attribution on; started before the run (its start-up is not in the window) and stopped once it has
     stored a result for every request of the run (at most 30 s after the run).
Each run is a lab recording (`record_run`): the high-priority load client's lateness is judged and a late
run is repeated, then rejected, as the lab does. Per run:
  - output tokens/s: the client's token counts (every request streams with `ignore_eos`, so the total is
    fixed) over the run's wall time, first intended send to last token; vLLM's own
    `vllm:generation_tokens_total` delta is printed beside it as a check. The lab's scenarios are open
    loop, and here vLLM finishes `whale2`'s whales about when the last short is sent, so this figure is
    mostly set by the schedule;
  - decode tokens/s per stream: 1 / vLLM's own mean inter-token latency over the run (the delta of the
    `vllm:inter_token_latency_seconds` histogram's sum and count, stamped by the engine core, so a stalled
    client cannot bend it): how fast vLLM steps, the compute-bound figure a CPU thief slows;
  - short-request TTFT p50, from the intended send time;
  - CPU over the run's window (sampled every 0.25 s from /proc): the agent process, vLLM's process group
    (API server + engine core), and the whole machine; the agent's RSS.
Goal: throughput with / without >= 0.99 (printed for both rates).

A compute-bound scenario (whales decoding long after the last short) was tried and dropped: vLLM then
streams ~1,000 tokens/s to the lab's Python client, which cannot keep up (event loop saturated, 4 s late),
so every run is rejected by the lateness check.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
import tempfile
import threading
import time
from bisect import bisect_left
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

from attrib_agent.lab.record import DEFAULT_MAX_LATENESS_S, RunRejected, record_run
from attrib_agent.lab.server import LabConfig, LabEndpoints, running_lab
from attrib_agent.lab.sidecar import AgentProcess, agent_beside
from attrib_agent.lab.summary import Spread, percentile, shorts, ttft_s
from attrib_agent.lab.workload import Scenario, get_scenario
from benchmarks._measure import machine

GOAL_RATIO = 0.99
SAMPLE_S = 0.25
AGENT_SETTLE_S = 30.0  # after a run, wait this long at most for the agent to store a result per request
CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
PAGE_KB = (os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096) // 1024
VLLM_SERIES = ("vllm:generation_tokens_total", "vllm:inter_token_latency_seconds_sum",
               "vllm:inter_token_latency_seconds_count")


# ---- /proc sampling --------------------------------------------------------------------------------------

def _stat_fields(pid: int | str) -> list[str] | None:
    """Fields 3.. of /proc/PID/stat (after the command name, which may hold spaces and parentheses)."""
    try:
        raw = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return raw.rsplit(")", 1)[1].split()


def proc_cpu_s(pid: int) -> float | None:
    f = _stat_fields(pid)
    return None if f is None else (int(f[11]) + int(f[12])) / CLK_TCK


def group_cpu_s(pgid: int) -> float:
    """CPU seconds (user + system) of every live process in the process group."""
    total = 0
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        f = _stat_fields(entry.name)
        if f is not None and int(f[2]) == pgid:
            total += int(f[11]) + int(f[12])
    return total / CLK_TCK


def rss_mb_of(pid: int) -> float | None:
    try:
        pages = int(Path(f"/proc/{pid}/statm").read_text().split()[1])
    except (OSError, ValueError, IndexError):
        return None
    return pages * PAGE_KB / 1024


def hwm_mb_of(pid: int) -> float | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024
    except (OSError, ValueError):
        return None
    return None


def machine_cpu_s() -> tuple[float, float]:
    """(busy, steal) CPU seconds of the whole machine since boot, summed over cores (/proc/stat)."""
    parts = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    v = [int(x) for x in parts[:8]] + [0] * max(0, 8 - len(parts))
    user, nice, system, _idle, _iowait, irq, softirq, steal = v[:8]
    return (user + nice + system + irq + softirq) / CLK_TCK, steal / CLK_TCK


@dataclass
class Sample:
    ts: float
    vllm_cpu_s: float
    machine_busy_s: float
    machine_steal_s: float
    agent_cpu_s: float | None = None
    agent_rss_mb: float | None = None


class Sampler:
    """Samples the CPU counters every SAMPLE_S in a thread; `at(ts)` interpolates any of them at a time."""

    def __init__(self, vllm_pgid: int, agent_pid: int | None) -> None:
        self.vllm_pgid, self.agent_pid = vllm_pgid, agent_pid
        self.samples: list[Sample] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="sampler", daemon=True)

    def sample(self) -> Sample:
        busy, steal = machine_cpu_s()
        s = Sample(time.time(), group_cpu_s(self.vllm_pgid), busy, steal)
        if self.agent_pid is not None:
            s.agent_cpu_s, s.agent_rss_mb = proc_cpu_s(self.agent_pid), rss_mb_of(self.agent_pid)
        return s

    def _run(self) -> None:
        while not self._stop.is_set():
            self.samples.append(self.sample())
            self._stop.wait(SAMPLE_S)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)
        self.samples.append(self.sample())

    def at(self, ts: float, get: Callable[[Sample], float | None]) -> float | None:
        """The counter `get` linearly interpolated at `ts` (clamped to the first/last sample)."""
        pts = [(s.ts, v) for s in self.samples if (v := get(s)) is not None]
        if not pts:
            return None
        times = [t for t, _ in pts]
        i = bisect_left(times, ts)
        if i <= 0:
            return pts[0][1]
        if i >= len(pts):
            return pts[-1][1]
        (t0, v0), (t1, v1) = pts[i - 1], pts[i]
        return v0 + (v1 - v0) * ((ts - t0) / (t1 - t0) if t1 > t0 else 1.0)

    def over(self, t0: float, t1: float, get: Callable[[Sample], float | None]) -> float | None:
        a, b = self.at(t0, get), self.at(t1, get)
        return None if a is None or b is None else b - a

    def max_in(self, t0: float, t1: float, get: Callable[[Sample], float | None]) -> float | None:
        vals = [v for s in self.samples if t0 <= s.ts <= t1 and (v := get(s)) is not None]
        return max(vals, default=None)


# ---- one run ---------------------------------------------------------------------------------------------

@dataclass
class Run:
    index: int
    condition: str  # "without" | "with"
    accepted: bool
    attempts: int
    lateness_ms: list[float]  # every attempt's client lateness, the accepted one last
    wall_s: float = 0.0
    requests_ok: int = 0
    requests: int = 0
    output_tokens: int = 0
    tokens_per_s: float = 0.0
    vllm_itl_ms: float | None = None  # vLLM's mean inter-token latency over the run (its histogram's deltas)
    decode_tokens_per_s: float | None = None  # per stream: 1 / vllm_itl
    vllm_generation_tokens_delta: float | None = None  # over all attempts (a check on the client's count)
    short_ttft_p50_ms: float | None = None
    short_ttft_p95_ms: float | None = None
    vllm_cpu_s: float | None = None
    machine_busy_s: float | None = None
    machine_steal_s: float | None = None
    agent_cpu_s: float | None = None  # in the run's window
    agent_cpu_run_s: float | None = None  # from /healthz until it stored a result per request (the run's work)
    agent_cpu_startup_s: float | None = None  # before /healthz answered (imports, sources starting)
    agent_rss_mb: float | None = None  # max sampled in the window
    agent_hwm_mb: float | None = None  # VmHWM at the end of the run
    agent_results: float | None = None  # attrib_results_stored at the end: one per request once it is done
    agent_lag_s: float | None = None
    error: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    @property
    def cores(self) -> dict[str, float | None]:
        def per(x: float | None) -> float | None:
            return None if x is None or self.wall_s <= 0 else x / self.wall_s
        return {"vllm": per(self.vllm_cpu_s), "agent": per(self.agent_cpu_s), "machine": per(self.machine_busy_s),
                "steal": per(self.machine_steal_s)}


def vllm_totals(lab: LabEndpoints) -> dict[str, float]:
    """vLLM's own counters this benchmark reads (summed over engines): tokens generated, ITL sum and count."""
    try:
        text = httpx.get(f"{lab.vllm_url}/metrics", timeout=5.0, trust_env=False).text
    except httpx.HTTPError:
        return {}
    out: dict[str, float] = {}
    for line in text.splitlines():
        name = line.split("{", 1)[0].split(" ", 1)[0]
        if name in VLLM_SERIES:
            out[name] = out.get(name, 0.0) + float(line.rsplit(" ", 1)[1])
    return out


def _agent_figures(agent: AgentProcess) -> dict[str, float | None]:
    out: dict[str, float | None] = {"results": None, "lag": None}
    try:
        text = httpx.get(f"{agent.api_url}/metrics", timeout=5.0, trust_env=False).text
    except httpx.HTTPError:
        return out
    for line in text.splitlines():
        if line.startswith("attrib_results_stored "):
            out["results"] = float(line.split()[1])
        elif line.startswith("attrib_pipeline_lag_seconds "):
            out["lag"] = float(line.split()[1])
    return out


@contextmanager
def _agent(lab: LabEndpoints, workdir: Path, interval_s: float) -> Iterator[AgentProcess]:
    with agent_beside(lab, workdir, extra_args=["--metrics-interval-s", str(interval_s)]) as agent:
        yield agent


def one_run(lab: LabEndpoints, scenario: Scenario, index: int, condition: str, workdir: Path, *,
            interval_s: float, attempts: int, max_lateness_s: float) -> Run:
    out = workdir / f"run{index:02d}-{condition}"
    ctx = _agent(lab, workdir / f"agent{index:02d}", interval_s) if condition == "with" else nullcontext(None)
    with ctx as agent:
        agent_pid = agent.proc.pid if agent is not None and agent.proc is not None else None
        startup = proc_cpu_s(agent_pid) if agent_pid is not None else None
        vllm0 = vllm_totals(lab)
        with Sampler(lab.vllm_pid, agent_pid) as sampler:
            try:
                res = record_run(lab, scenario, out, command="benchmarks.overhead", attempts=attempts,
                                 max_lateness_s=max_lateness_s, compress=False)
            except RunRejected as exc:
                late = [float(x) for x in re.findall(r"([0-9]+) ms", str(exc))[:-1]]  # the last is the limit
                return Run(index, condition, False, attempts, late, error=str(exc))
            figures: dict[str, float | None] = {}
            waited = 0.0
            if agent is not None:  # let it finish attributing the run, so its CPU for the run is all counted
                t = time.monotonic()
                while True:
                    figures = _agent_figures(agent)
                    if (figures["results"] or 0) >= len(res.results) or time.monotonic() - t > AGENT_SETTLE_S:
                        break
                    time.sleep(0.5)
                waited = time.monotonic() - t
        vllm1 = vllm_totals(lab)
        hwm = hwm_mb_of(agent_pid) if agent_pid is not None else None
    meta = res.meta
    lateness = [x * 1000 for x in meta.get("rejected_attempts_lateness_s", [])]
    lateness.append(float(meta["client_lateness"]["lateness_s"]) * 1000)
    results = res.results
    t0 = min(float(r["intended_send_ts"]) for r in results)
    t1 = max(float(r["finish_ts"] or r["intended_send_ts"]) for r in results)
    ok = [r for r in results if r["status"] == "ok"]
    tokens = sum(int(r["output_tokens"]) for r in results)
    ttfts = [t * 1000 for t in map(ttft_s, shorts(results)) if t is not None]
    d = {k: vllm1[k] - vllm0[k] for k in VLLM_SERIES if k in vllm0 and k in vllm1}
    itl_n, itl_sum = d.get("vllm:inter_token_latency_seconds_count"), d.get("vllm:inter_token_latency_seconds_sum")
    itl = itl_sum / itl_n if itl_n and itl_sum is not None else None
    run = Run(index, condition, True, len(lateness), [round(x, 1) for x in lateness], wall_s=t1 - t0,
              requests_ok=len(ok), requests=len(results), output_tokens=tokens, tokens_per_s=tokens / (t1 - t0),
              vllm_itl_ms=None if itl is None else itl * 1000, decode_tokens_per_s=None if not itl else 1 / itl,
              vllm_generation_tokens_delta=d.get("vllm:generation_tokens_total"),
              short_ttft_p50_ms=percentile(ttfts, 50) if ttfts else None,
              short_ttft_p95_ms=percentile(ttfts, 95) if ttfts else None,
              vllm_cpu_s=sampler.over(t0, t1, lambda s: s.vllm_cpu_s),
              machine_busy_s=sampler.over(t0, t1, lambda s: s.machine_busy_s),
              machine_steal_s=sampler.over(t0, t1, lambda s: s.machine_steal_s))
    if agent_pid is not None:
        run.agent_cpu_s = sampler.over(t0, t1, lambda s: s.agent_cpu_s)
        run.agent_cpu_startup_s = startup
        last = sampler.samples[-1].agent_cpu_s
        run.agent_cpu_run_s = None if last is None or startup is None else last - startup
        run.agent_rss_mb = sampler.max_in(t0, t1, lambda s: s.agent_rss_mb)
        run.agent_hwm_mb = hwm
        run.agent_results, run.agent_lag_s = figures.get("results"), figures.get("lag")
        run.extra["agent_settle_wait_s"] = round(waited, 2)
    run.extra["client_lateness"] = meta["client_lateness"]
    if not res.accepted:
        run.accepted = False
    shutil.rmtree(out, ignore_errors=True)
    return run


# ---- summary ---------------------------------------------------------------------------------------------

def _spread(values: Sequence[float | None]) -> Spread | None:
    xs = [v for v in values if v is not None]
    return Spread.of(xs) if xs else None


def _fmt(s: Spread | None, scale: float = 1.0, digits: int = 1) -> str:
    if s is None:
        return "-"
    return (f"{s.mean * scale:.{digits}f} +- {s.std * scale:.{digits}f} "
            f"({s.min * scale:.{digits}f}-{s.max * scale:.{digits}f})")


def summarise(runs: Sequence[Run]) -> dict[str, Any]:
    ok = [r for r in runs if r.accepted]
    by = {c: [r for r in ok if r.condition == c] for c in ("without", "with")}
    out: dict[str, Any] = {"accepted": {c: len(v) for c, v in by.items()},
                           "rejected": sum(not r.accepted for r in runs)}
    keys: dict[str, Callable[[Run], float | None]] = {
        "tokens_per_s": lambda r: r.tokens_per_s, "short_ttft_p50_ms": lambda r: r.short_ttft_p50_ms,
        "decode_tokens_per_s": lambda r: r.decode_tokens_per_s, "vllm_itl_ms": lambda r: r.vllm_itl_ms,
        "short_ttft_p95_ms": lambda r: r.short_ttft_p95_ms, "wall_s": lambda r: r.wall_s,
        "lateness_ms": lambda r: r.lateness_ms[-1] if r.lateness_ms else None,
        "vllm_cores": lambda r: r.cores["vllm"], "machine_cores": lambda r: r.cores["machine"],
        "steal_cores": lambda r: r.cores["steal"],
        "other_cores": lambda r: (None if r.cores["machine"] is None or r.cores["vllm"] is None else
                                  r.cores["machine"] - r.cores["vllm"] - (r.cores["agent"] or 0.0)),
        "agent_cpu_s": lambda r: r.agent_cpu_s, "agent_cores": lambda r: r.cores["agent"],
        "agent_cpu_run_s": lambda r: r.agent_cpu_run_s, "agent_cpu_startup_s": lambda r: r.agent_cpu_startup_s,
        "agent_rss_mb": lambda r: r.agent_rss_mb, "agent_hwm_mb": lambda r: r.agent_hwm_mb,
    }
    for cond, rs in by.items():
        out[cond] = {k: (s.as_dict() if (s := _spread([get(r) for r in rs])) else None) for k, get in keys.items()}
    ratios: dict[str, Any] = {}
    for k in ("tokens_per_s", "decode_tokens_per_s", "short_ttft_p50_ms"):
        a, b = out["without"][k], out["with"][k]
        ratios[k] = None if not a or not b or not a["mean"] else b["mean"] / a["mean"]
    # Per pair (both runs of a pair accepted): drift between pairs cancels within each.
    pairs: dict[int, dict[str, Run]] = {}
    for r in ok:
        pairs.setdefault(r.index // 2, {})[r.condition] = r
    per_pair = [p["with"].tokens_per_s / p["without"].tokens_per_s for p in pairs.values() if len(p) == 2]
    decode_pairs = [w / wo for p in pairs.values() if len(p) == 2
                    and (w := p["with"].decode_tokens_per_s) and (wo := p["without"].decode_tokens_per_s)]
    ttft_pairs = [p["with"].short_ttft_p50_ms / p["without"].short_ttft_p50_ms for p in pairs.values()
                  if len(p) == 2 and p["with"].short_ttft_p50_ms and p["without"].short_ttft_p50_ms]
    ratios["tokens_per_s_pairs"] = (s.as_dict() if (s := _spread(per_pair)) else None)
    ratios["short_ttft_p50_pairs"] = (s.as_dict() if (s := _spread(ttft_pairs)) else None)
    ratios["decode_tokens_per_s_pairs"] = (s.as_dict() if (s := _spread(decode_pairs)) else None)
    out["ratios"] = ratios
    return out


def _row(r: Run) -> str:
    if not r.accepted:
        return f"{r.index:>3} {r.condition:<8} REJECTED (client lateness {r.lateness_ms} ms): {r.error}"
    c = r.cores
    agent = "" if r.condition == "without" else (
        f" | agent {r.agent_cpu_s or 0:.2f} CPU s ({(c['agent'] or 0):.3f} cores), "
        f"{r.agent_rss_mb or 0:.0f} MB, {r.agent_results or 0:.0f} results")
    gen = r.vllm_generation_tokens_delta
    return (f"{r.index:>3} {r.condition:<8} late {r.lateness_ms[-1]:>5.1f} ms (x{r.attempts}) "
            f"{r.output_tokens:>5} tok/{r.requests_ok}/{r.requests} ok (vLLM {gen if gen is None else int(gen)}) "
            f"{r.wall_s:>6.2f} s {r.tokens_per_s:>6.1f} tok/s, vLLM ITL {r.vllm_itl_ms or 0:.2f} ms "
            f"({r.decode_tokens_per_s or 0:.0f} tok/s a stream)  TTFT p50 {r.short_ttft_p50_ms or 0:>6.1f} ms  "
            f"p95 {r.short_ttft_p95_ms or 0:>6.1f} ms | vLLM {c['vllm'] or 0:.2f} cores, "
            f"machine {c['machine'] or 0:.2f}, steal {c['steal'] or 0:.2f}{agent}")


def report(s: Mapping[str, Any]) -> str:
    def sp(cond: str, key: str, scale: float = 1.0, digits: int = 1) -> str:
        d = s[cond].get(key)
        return _fmt(Spread(**d) if d else None, scale, digits)

    r = s["ratios"]
    lines = [
        f"\naccepted runs: without {s['accepted']['without']}, with {s['accepted']['with']}; "
        f"rejected: {s['rejected']}   (mean +- std (min-max) over runs)",
        f"{'':<26}{'without agent':>34}{'with agent':>34}",
    ]
    for key, label, digits in (("tokens_per_s", "output tokens/s", 1),
                               ("decode_tokens_per_s", "decode tok/s a stream", 1),
                               ("vllm_itl_ms", "vLLM mean ITL ms", 3),
                               ("short_ttft_p50_ms", "short TTFT p50 ms", 1),
                               ("short_ttft_p95_ms", "short TTFT p95 ms", 1), ("wall_s", "run wall s", 2),
                               ("lateness_ms", "client lateness ms", 1), ("vllm_cores", "vLLM cores (CPU s/s)", 2),
                               ("machine_cores", "machine busy cores", 2), ("other_cores", "other cores", 2),
                               ("steal_cores", "steal cores", 2)):
        lines.append(f"{label:<26}{sp('without', key, digits=digits):>34}{sp('with', key, digits=digits):>34}")
    lines += [
        "",
        f"agent CPU s in the run window   {sp('with', 'agent_cpu_s', digits=2)}  "
        f"= {sp('with', 'agent_cores', digits=3)} cores",
        f"agent CPU s, whole run          {sp('with', 'agent_cpu_run_s', digits=2)}  "
        f"(start-up before /healthz: {sp('with', 'agent_cpu_startup_s', digits=2)})",
        f"agent RSS MB (max in window)    {sp('with', 'agent_rss_mb')}   VmHWM {sp('with', 'agent_hwm_mb')}",
        "",
    ]
    tp, ttft, dec = r["tokens_per_s"], r["short_ttft_p50_ms"], r["decode_tokens_per_s"]
    tpp, ttp, decp = r["tokens_per_s_pairs"], r["short_ttft_p50_pairs"], r["decode_tokens_per_s_pairs"]
    lines.append(f"throughput with/without: {tp:.4f} (of the means); per pair "
                 f"{_fmt(Spread(**tpp) if tpp else None, 1, 4)}" if tp is not None else "throughput ratio: -")
    lines.append(f"decode tokens/s a stream with/without: {dec:.4f} (of the means); per pair "
                 f"{_fmt(Spread(**decp) if decp else None, 1, 4)}" if dec is not None else "decode rate ratio: -")
    lines.append(f"short TTFT p50 with/without: {ttft:.3f} (of the means); per pair "
                 f"{_fmt(Spread(**ttp) if ttp else None, 1, 3)}" if ttft is not None else "short TTFT p50 ratio: -")
    for label, x in (("output tokens/s over the run", tp), ("decode tokens/s a stream", dec)):
        if x is not None:
            lines.append(f"goal: {label} ratio >= {GOAL_RATIO}: {'met' if x >= GOAL_RATIO else 'MISSED'}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--reps", type=int, default=3, help="pairs of runs (without, with), ABAB order (default 3)")
    ap.add_argument("--scenario", default="whale2", help="lab scenario to run (default whale2)")
    ap.add_argument("--warmup", type=int, default=1, help="unmeasured runs first, without the agent (default 1)")
    ap.add_argument("--metrics-interval-s", type=float, default=0.1, help="the agent's /metrics poll (default 0.1)")
    ap.add_argument("--attempts", type=int, default=4, help="tries per run before it is rejected as late")
    ap.add_argument("--max-lateness-s", type=float, default=DEFAULT_MAX_LATENESS_S,
                    help=f"client lateness above which a run is repeated (default {DEFAULT_MAX_LATENESS_S})")
    ap.add_argument("--attach", type=Path, default=None, metavar="STATE",
                    help="use a lab from `attrib-agent lab serve --state-file STATE` instead of starting one")
    ap.add_argument("--workdir", type=Path, default=None, help="where runs and agent logs go (default: a temp dir)")
    ap.add_argument("--json", type=Path, default=None, help="write every run and the summary as JSON here too")
    args = ap.parse_args(argv)
    if args.reps < 1:
        ap.error("--reps must be >= 1")
    scenario = get_scenario(args.scenario)
    print(f"machine: {machine()}")
    print(f"scenario {scenario.name}: {scenario.description}; {args.reps} pairs, ABAB, after {args.warmup} warm-up; "
          f"agent polls /metrics every {args.metrics_interval_s} s", flush=True)
    tmp = None
    if args.workdir is None:
        tmp = tempfile.TemporaryDirectory(prefix="attrib-overhead-")
        workdir = Path(tmp.name)
    else:
        workdir = args.workdir
        workdir.mkdir(parents=True, exist_ok=True)
    runs: list[Run] = []
    started = time.monotonic()
    try:
        with running_lab(LabConfig(), args.attach) as lab:
            print(f"vLLM {lab.vllm_url} (process group {lab.vllm_pid}), log {lab.server_log}", flush=True)
            for w in range(args.warmup):
                run = one_run(lab, scenario, -1 - w, "without", workdir, interval_s=args.metrics_interval_s,
                              attempts=args.attempts, max_lateness_s=args.max_lateness_s)
                print(f"warm-up: {_row(run)}", flush=True)
            for i in range(2 * args.reps):
                cond = ("without", "with")[i % 2]
                run = one_run(lab, scenario, i, cond, workdir, interval_s=args.metrics_interval_s,
                              attempts=args.attempts, max_lateness_s=args.max_lateness_s)
                runs.append(run)
                print(_row(run), flush=True)
    finally:
        if tmp is not None:
            tmp.cleanup()
    summary = summarise(runs)
    print(report(summary))
    print(f"took {time.monotonic() - started:.0f} s")
    if args.json is not None:
        args.json.write_text(json.dumps({
            "machine": machine(), "scenario": scenario.name, "reps": args.reps, "warmup": args.warmup,
            "metrics_interval_s": args.metrics_interval_s, "max_lateness_s": args.max_lateness_s,
            "runs": [asdict(r) | {"cores": r.cores} for r in runs], "summary": summary,
        }, indent=2))
    return 0 if summary["ratios"]["tokens_per_s"] is not None else 1


if __name__ == "__main__":
    sys.exit(main())
