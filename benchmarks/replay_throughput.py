"""Replay throughput (issue #7, item 2): a >= 1M-event recording through the full pipeline on one core.

    .venv/bin/python -m benchmarks.replay_throughput                 # 1M events (first run builds it, ~1 min)
    .venv/bin/python -m benchmarks.replay_throughput --events 50000  # the CI-sized variant
    .venv/bin/python -m benchmarks.replay_throughput --input gpu-rate [--duration 600] [--full-events N]
                                                    # issue 14: a never-idle GPU server's stream (_gpu_rate.py)
    .venv/bin/python -m benchmarks.replay_throughput --input gpu-rate --decode-only --digest
                                                    # the decode floor alone, and the decoded events' hash

Three passes over the same built recording (see _recordings.py), each timed alone:
  raw     the records read and JSON-decoded (`Recording.records`, every input stream): the I/O floor
  decode  `ReplaySource.events()`: the records through the live parsers into typed events: the floor
  timeline `ReplaySource.events()` -> `EngineTimeline.feed`, and at each settle tick (the pipeline's 0.25 s of
          event time) what a settle reads of the timeline before attributing (lifecycles, outcomes, preemptions):
          the ingest side alone, attribution off (issue 14 item 4)
  full    `ReplaySource.events()` -> `AttributionPipeline.feed`, then `settle()`: what the agent does
Goals: full >= 100,000 events/s and full >= 0.5 x decode; the timeline pass is printed with its share of that
budget (timeline alone >= 0.5 x decode, or the pipeline cannot be). With `--input gpu-rate` the input's own rates are
printed first with their goals (issue 14 item 1), and `--full-events N` replays only its first N events through
the pipeline (the full pass over ten never-idle minutes does not end in reasonable time today).
Rates are per wall second of the pass and, in brackets, per CPU second (on a shared machine the pinned core is
not always ours). The timeline and full passes run the collector as the agent does (its `GcFreezer` freezes the
survivors every second, here of the pass's event time, as benchmarks/forecast_latency.py; the agent ticks on the
wall clock); `--no-gc-freeze` leaves it as it is, as every run before 2026-11-26's seventh session did: full
collections over the unfrozen heap then cost 25-50 % of the timeline pass on the GPU-rate input.
`--compiled` measures the opt-in compiled build (`ATTRIB_MYPYC=1 pip install .`, docs/deployment.md): the
modules listed once in attrib_agent/agent/build_kind.py (`COMPILED_MODULES`) built with mypyc (the
same source, same float operations: the digests must not move), in a copy of the tree under the cache directory
(built once per source hash), and the same command run there.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import hashlib
import json
import os
import pstats
import shutil
import subprocess
import sys
import time
from contextlib import nullcontext
from itertools import islice
from pathlib import Path
from typing import Any

from attrib_agent.agent.build_kind import COMPILED_MODULES, build_kind, compiled_sources
from attrib_agent.agent.gc_freeze import GcFreezer
from attrib_agent.attribution import attributor
from attrib_agent.pipeline import AttributionPipeline, PipelineConfig
from attrib_agent.recording import Recording
from attrib_agent.sources.replay import ReplaySource
from attrib_agent.timeline.engine_timeline import EngineTimeline
from benchmarks._gpu_rate import cached_gpu_rate, measure
from benchmarks._measure import Span, machine, peak_rss_mb, pin_one_core, pipeline_sizes, timed
from benchmarks._recordings import INPUT_STREAMS, cached_concatenation, default_cache_dir

GOAL_EVENTS_PER_S = 100_000
GOAL_FLOOR_RATIO = 0.5
GOAL_STEPS_PER_S = 100  # issue 14 item 1: a GPU server's rates, never idle, for >= 10 minutes
GOAL_FINISHED_PER_S = 50
GOAL_DURATION_S = 600
GOAL_MAX_IDLE_S = 0.1
COMPILED_BUILDS_KEPT = 3  # compiled builds kept in the cache directory, the newest (one per source hash)
_ROOT = Path(__file__).resolve().parent.parent


def raw_pass(path: Path) -> int:
    rec = Recording(path)
    return sum(1 for s in INPUT_STREAMS for _ in rec.records(s))


def decode_pass(path: Path, limit: int | None = None) -> int:
    return sum(1 for _ in islice(ReplaySource(path).events(), limit))


def decode_digest(path: Path, limit: int | None = None) -> tuple[int, str]:
    """(events, hash) of every decoded event's `repr` and each stream's health counts after them: a parser or
    reader change that only speeds decoding keeps this hash (run apart from the timed pass, which it would slow)."""
    src = ReplaySource(path)
    h = hashlib.sha256()
    n = 0
    for ev in islice(src.events(), limit):
        h.update(repr(ev).encode())
        n += 1
    for stream, health in sorted(src.health.items()):
        h.update(repr((stream, health.ok_total, sorted(health.skipped.items()), sorted(health.errors.items()),
                       health.last_success_ts, health.last_error)).encode())
    return n, h.hexdigest()[:16]


class Collector:
    """The collector during a pass: the agent's freezer ticked on the pass's event time (`freeze`), or left as it
    is; counts the freezer's passes and automatic full collections, and unfreezes at the pass's end."""

    def __init__(self, freeze: bool) -> None:
        self.now = 0.0  # the pass's event time since its first tick
        self._t0: float | None = None
        self.freezer = GcFreezer(clock=lambda: self.now) if freeze else None
        if self.freezer is not None:  # as the agent's consumer, before the first event: outside the timed pass
            self.freezer.start()
        self.passes, self.longest_s, self._full0 = 0, 0.0, gc.get_stats()[2]["collections"]

    def tick(self, ts: float) -> None:
        if self.freezer is not None:
            if self._t0 is None:
                self._t0 = ts
            self.now = ts - self._t0
            if self.freezer.tick():
                self.passes += 1
                self.longest_s = max(self.longest_s, self.freezer.pauses_s[-1])

    def end(self) -> str:
        """What the collector did in the pass, its frozen objects unfrozen (outside the timed pass: the caller)."""
        full = gc.get_stats()[2]["collections"] - self._full0
        f = self.freezer
        if f is None:
            return f"{full} full collections"
        f.stop()
        gc.collect()  # what the pass left (frozen cycles among it) not charged to the next pass
        return (f"{self.passes} freezer passes (longest {self.longest_s * 1000:.0f} ms), "
                f"{full - self.passes} other full collections")


def timeline_pass(path: Path, limit: int | None = None, digest: Any | None = None,
                  collector: Collector | None = None) -> int:
    """Events into the pipeline's timeline alone, read at the pipeline's settle ticks as a settle reads it; with
    `digest`, what each tick read (counts) and the final lifecycles, outcomes and preemptions go into it. The
    collector's freezer ticks at the settle ticks (every 0.25 s of event time; a pass at most every second)."""
    cfg = PipelineConfig()
    tl = EngineTimeline(cfg.block_size, cfg.num_blocks, engine=cfg.engine, token_budget=cfg.token_budget)
    n, next_tick = 0, None
    for ev in islice(ReplaySource(path).events(), limit):
        tl.feed(ev)
        n += 1
        if next_tick is None:
            next_tick = ev.ts + cfg.settle_interval_s
        elif ev.ts >= next_tick:
            next_tick = ev.ts + cfg.settle_interval_s
            read = (len(tl.lifecycles()), len(tl.outcomes()), len(tl.preemptions()))
            if collector is not None:
                collector.tick(ev.ts)
            if digest is not None:
                digest.update(repr(read).encode())
    if digest is not None:
        digest.update(repr((tl.lifecycles(), tl.outcomes(), tl.preemptions())).encode())
    return n


def compiled_site(cache_dir: Path | None) -> Path:
    """The package as `ATTRIB_MYPYC=1 pip install` ships it (setup.py: `COMPILED_MODULES` built by mypyc), installed
    into a directory under the cache directory, keyed by the sources' hash: built once (~30-60 s), offline
    (`--no-build-isolation --no-index`: this environment's setuptools and mypy). Needs a C compiler and the Python
    headers; without them it raises with the build's own words (a test of the build must fail, not skip)."""
    files = sorted(f for f in (_ROOT / "attrib_agent").rglob("*")
                   if f.is_file() and "__pycache__" not in f.parts and f.suffix not in (".pyc", ".so", ".pyd"))
    files += [_ROOT / "setup.py", _ROOT / "pyproject.toml", _ROOT / "README.md"]
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(_ROOT)).encode() + b"\0" + f.read_bytes())
    out = (cache_dir or default_cache_dir()) / f"compiled-{h.hexdigest()[:16]}"
    if (out / "built").exists():
        return out / "site"
    shutil.rmtree(out, ignore_errors=True)
    for f in files:
        (out / "src" / f.relative_to(_ROOT)).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(f, out / "src" / f.relative_to(_ROOT))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "--no-input"]
    _build_step(pip, ["wheel", "--no-build-isolation", "--no-deps", "--no-index", "-w", str(out / "dist"), "."],
                out / "src")
    _build_step(pip, ["install", "--no-deps", "--no-index", "--target", str(out / "site"),
                      *map(str, (out / "dist").glob("*.whl"))], out / "src")
    (out / "built").write_text("\n".join(compiled_sources()) + "\n")
    prune_compiled(out.parent, keep=COMPILED_BUILDS_KEPT)
    return out / "site"


def prune_compiled(cache: Path, keep: int) -> list[Path]:
    """Drop all but the `keep` newest compiled builds (~35 MB each, one per source hash) from the cache directory:
    the ones this builder made (with a `site/`), oldest first; returns what went."""
    builds = sorted((d for d in cache.glob("compiled-*") if (d / "built").exists() and (d / "site").is_dir()),
                    key=lambda d: (d / "built").stat().st_mtime)
    gone = builds[:max(0, len(builds) - keep)]
    for d in gone:
        shutil.rmtree(d, ignore_errors=True)
    return gone


def _build_step(pip: list[str], args: list[str], cwd: Path) -> None:
    """One pip step of the compiled build; a failure raised with the tail of pip's (and the compiler's) output."""
    done = subprocess.run([*pip, *args], cwd=cwd, env={**os.environ, "ATTRIB_MYPYC": "1"}, capture_output=True,
                          text=True)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise RuntimeError(f"the compiled build failed at `pip {args[0]}` (ATTRIB_MYPYC=1 needs mypy's mypyc, a C "
                           f"compiler and the Python headers):\n{tail}")


def run_with(site: Path, args: list[str], *, capture: bool = False) -> subprocess.CompletedProcess[str]:
    """This benchmark run with the package installed in `site` first on the path (this tree's benchmarks/ after it,
    for the harness and the inputs): the same command over another build."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(_ROOT)])}
    return subprocess.run([sys.executable, "-m", "benchmarks.replay_throughput", *args], cwd=site, env=env, text=True,
                          capture_output=capture)


class RunStats:
    """`--run-stats`: every re-simulation question of the full pass (`_PeriodPlan._simulate`, wrapped for the pass),
    and what the levers left in docs/attribution.md ("Replay throughput") could at most save of the runs simulated,
    each run's CPU taken as spread evenly over its event time (an estimate: a bound's order, not a figure to bank)."""

    def __init__(self) -> None:
        self.rows: list[dict[str, Any]] = []
        self._orig: Any = None

    def __enter__(self) -> RunStats:
        plan_cls = attributor._PeriodPlan
        self._orig = orig = plan_cls._simulate
        rows = self.rows

        def counted(plan: Any, removed: frozenset[str], readers: Any, traced: bool) -> Any:
            readers = list(readers)
            hits, t0 = plan._runs.hits, time.process_time()
            result = orig(plan, removed, readers, traced)
            dt = time.process_time() - t0
            start = plan._start
            placed = {ip.request_id for ip in start.state} if start is not None else set()
            begin = start.ts if start is not None else plan.period[0].arrival_ts if plan.period else 0.0
            awaited = [v for v in readers if v not in removed]
            late = [r.arrival_ts for r in plan.period if r.request_id in removed and r.request_id not in placed]
            rows.append({
                "hit": plan._runs.hits > hits, "cpu_s": dt, "traced": traced, "steps": result.steps,
                "begin": begin, "removed": len(removed), "removed_placed": len(removed) - len(late),
                "stop": max((result.outcomes[v].finish_ts or begin for v in awaited), default=begin),
                "first_removed": min(late, default=None),
                "first_reader": min((plan._arrivals[v] for v in awaited), default=None),
                "start": (begin, frozenset(placed)), "version": plan._version, "removed_ids": removed,
                "kept": [r for r in plan.period if r.request_id not in removed], "readers": frozenset(awaited)})
            return result

        setattr(plan_cls, "_simulate", counted)  # noqa: B010 (a method replaced for the pass: mypy refuses assigning one)
        return self

    def __exit__(self, *exc: object) -> None:
        setattr(attributor._PeriodPlan, "_simulate", self._orig)  # noqa: B010

    def report(self) -> str:
        runs = [r for r in self.rows if not r["hit"]]
        cpu = sum(r["cpu_s"] for r in runs)
        lines = [f"re-simulation questions {len(self.rows):,}, runs simulated {len(runs):,} ({cpu:.2f} CPU s, "
                 f"{sum(r['steps'] for r in runs):,} steps; traced {sum(r['traced'] for r in runs):,} of them, "
                 f"{sum(r['cpu_s'] for r in runs if r['traced']):.2f} s)"]
        # (a) resumed: an earlier run from the same start, without as many, traced alike, ran the part of this one up
        # to its own stop; exactly so only when priced by the same cost version, without the same requests, with
        # the same arrivals up to its stop, and (traced) with this run's victims traced in it
        seen: dict[tuple[Any, ...], dict[str, Any]] = {}
        resumable = {True: [0, 0.0], False: [0, 0.0]}
        exact = {True: [0, 0.0], False: [0, 0.0]}
        earlier: list[dict[str, Any]] = []
        for r in self.rows:
            key = (r["start"], r["removed"], r["traced"])
            if not r["hit"] and key in seen:
                resumable[r["traced"]][0] += 1
                resumable[r["traced"]][1] += _share(seen[key]["stop"], r) * r["cpu_s"]
            if not r["hit"]:
                share = max((_share(e["stop"], r) for e in earlier if _resumes(e, r)), default=0.0)
                exact[r["traced"]][0] += share > 0
                exact[r["traced"]][1] += share * r["cpu_s"]
                earlier.append(r)
            seen[key] = r
        lines.append(f"(a) resumable from an earlier run of the same start: untraced {resumable[False][0]} runs, "
                     f"<= {resumable[False][1]:.2f} s; traced {resumable[True][0]}, <= {resumable[True][1]:.2f} s; "
                     f"exactly (same prices, removed, arrivals to its stop; traced: its victims traced there): "
                     f"untraced {exact[False][0]}, <= {exact[False][1]:.2f} s; traced {exact[True][0]}, "
                     f"<= {exact[True][1]:.2f} s ({len({r['version'] for r in self.rows})} cost versions)")
        # (b) a counterfactual run started where it parts from the world with everyone: the first removed arrival
        cf = [r for r in runs if r["removed"] and not r["removed_placed"] and r["first_removed"] is not None]
        untraced = sum(_share(r["first_removed"], r) * r["cpu_s"] for r in cf if not r["traced"])
        eligible = [r for r in cf if r["traced"] and (r["first_reader"] or 0.0) > r["first_removed"]]
        traced = sum(_share(r["first_removed"], r) * r["cpu_s"] for r in eligible)
        lines.append(f"(b) counterfactual runs before the first removed arrival: {len(cf)} runs of "
                     f"{sum(r['cpu_s'] for r in cf):.2f} s; untraced <= {untraced:.2f} s, traced whose victims "
                     f"arrive after it ({len(eligible)} runs) <= {traced:.2f} s")
        return "\n".join(lines)


def _resumes(before: dict[str, Any], row: dict[str, Any]) -> bool:
    """Whether the run `before` is exactly `row`'s run up to its own stop (were it kept where it stopped)."""
    if any(before[k] != row[k] for k in ("version", "start", "removed_ids")):
        return False
    if row["traced"] and not (before["traced"] and row["readers"] <= before["readers"]):
        return False
    upto = before["stop"]
    return [r for r in before["kept"] if r.arrival_ts <= upto] == [r for r in row["kept"] if r.arrival_ts <= upto]


def _share(upto: float, row: dict[str, Any]) -> float:
    """The part of a run's event time before `upto` (0 to 1)."""
    span = row["stop"] - row["begin"]
    return min(1.0, max(0.0, (upto - row["begin"]) / span)) if span > 0 else 0.0


def _goal(name: str, ok: bool, what: str) -> None:
    print(f"goal {name}: {'met' if ok else 'MISSED'} ({what})")


def gpu_rate_input(args: argparse.Namespace) -> tuple[Path, int]:
    """The GPU-rate recording (built once, cached) and its events; prints its rates against item 1's goals."""
    with timed() as build:
        info = cached_gpu_rate(args.duration, cache_dir=args.cache_dir)
    print(f"recording: {info.path}\n  {info.copies} time-compressed copies of bench-mixed/bench-prefix, "
          f"{sum(info.records.values()):,} records {info.records} (ready in {build.wall_s:.1f} s)")
    r = measure(info.path)
    print(f"  {r.events:,} events over {r.span_s:.0f} s of event time: {r.steps_per_s:,.0f} steps/s, "
          f"{r.finished_per_s:.1f} finished requests/s, longest idle {r.max_idle_s * 1000:.1f} ms, KV max "
          f"{r.kv_max:.2f} (>= 0.9 in {r.kv_near_full_share:.0%} of scrapes), {r.whales} whales, "
          f"{r.restarts} restarts")
    _goal(f"steps/s >= {GOAL_STEPS_PER_S}", r.steps_per_s >= GOAL_STEPS_PER_S, f"{r.steps_per_s:,.0f}")
    _goal(f"finished/s >= {GOAL_FINISHED_PER_S}", r.finished_per_s >= GOAL_FINISHED_PER_S, f"{r.finished_per_s:.1f}")
    _goal(f"never idle >= {GOAL_DURATION_S} s", r.span_s >= GOAL_DURATION_S and r.max_idle_s <= GOAL_MAX_IDLE_S,
          f"{r.span_s:.0f} s, longest idle {r.max_idle_s * 1000:.1f} ms")
    return info.path, r.events


def full_pass(path: Path, digest: Any | None = None, limit: int | None = None,
              collector: Collector | None = None) -> tuple[int, AttributionPipeline]:
    """Every event fed (the first `limit`); with `digest` (a hashlib object), every result emitted goes into it.
    The collector's freezer ticks after every event (a pass at most every second of event time)."""
    p = AttributionPipeline()
    n = 0
    for ev in islice(ReplaySource(path).events(), limit):
        out = p.feed(ev)
        n += 1
        if collector is not None:
            collector.tick(ev.ts)
        if digest is not None:
            for r in out:
                digest.update(repr(r).encode())
    for r in p.settle():
        if digest is not None:
            digest.update(repr(r).encode())
    return n, p


def _goal_decode(n: int, dec: Span) -> None:
    rate, cpu_rate = n / dec.wall_s, n / max(dec.cpu_s, 1e-9)
    _goal("decode floor >= 100,000 events/s (else the floor caps the goal)", rate >= GOAL_EVENTS_PER_S,
          f"{rate:,.0f}, {rate / GOAL_EVENTS_PER_S:.3f} x goal; "
          f"CPU {cpu_rate:,.0f}, {cpu_rate / GOAL_EVENTS_PER_S:.3f} x")


def _rate(n: int, span: Span) -> str:
    return f"{n / span.wall_s:>10,.0f}/s  ({n / span.cpu_s:,.0f}/s CPU)" if span.wall_s and span.cpu_s else "-"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--events", type=int, default=1_000_000, help="input events to build and replay (>=)")
    ap.add_argument("--cache-dir", type=Path, default=None, help=f"where built recordings live ({default_cache_dir()})")
    ap.add_argument("--cpu", type=int, default=1, help="core to pin to (-1: do not pin)")
    ap.add_argument("--profile", type=Path, default=None,
                    help="also profile the full pass (the timeline pass with --timeline-only; cProfile) into this file")
    ap.add_argument("--timeline-only", action="store_true",
                    help="raw, decode and timeline passes only (attribution off: the ingest side alone)")
    ap.add_argument("--decode-only", action="store_true",
                    help="raw and decode passes only (the floor; with --digest, the decoded events' hash)")
    ap.add_argument("--digest", action="store_true", help="print a hash of every result emitted, of what the timeline "
                    "read and of every decoded event (same code, same hash: checks an optimisation changed nothing)")
    ap.add_argument("--json", type=Path, default=None, help="write the figures as JSON here too")
    ap.add_argument("--input", choices=("concat", "gpu-rate"), default="concat",
                    help="concat: the lab recordings back to back (issue 7); gpu-rate: a never-idle GPU server's "
                         "stream (issue 14, benchmarks/_gpu_rate.py)")
    ap.add_argument("--duration", type=float, default=GOAL_DURATION_S, help="gpu-rate: seconds of event time")
    ap.add_argument("--full-events", type=int, default=0,
                    help="decode, timeline and full passes over the first N events only")
    ap.add_argument("--no-gc-freeze", action="store_true",
                    help="leave the collector as it is in the timeline and full passes (every run before 2026-11-26's "
                         "seventh session did), instead of freezing survivors every second of event time, as the "
                         "agent does every second")
    ap.add_argument("--run-stats", action="store_true",
                    help="count the full pass's re-simulation runs and what resuming them across passes (a) or "
                         "starting a counterfactual where it parts from the full world (b) could at most save")
    ap.add_argument("--compiled", action="store_true",
                    help=f"run the same command with the {len(COMPILED_MODULES)} modules of build_kind's "
                         "COMPILED_MODULES (the re-simulation, the step inference, the pipeline) built by mypyc, in a "
                         "copy of this tree under the cache directory (what `ATTRIB_MYPYC=1 pip install .` ships)")
    args = ap.parse_args(argv)
    if args.compiled:
        site = compiled_site(args.cache_dir)
        rest = [a for a in (sys.argv[1:] if argv is None else argv) if a != "--compiled"]
        print(f"compiled: {len(COMPILED_MODULES)} modules (mypyc), the ATTRIB_MYPYC=1 build installed in {site}",
              flush=True)
        return run_with(site, rest).returncode

    pinned = pin_one_core(None if args.cpu < 0 else args.cpu)
    print(f"machine: {machine()}\n{pinned}\nbuild: {build_kind()}\ncollector in the timeline and full passes: "
          f"{'as it is' if args.no_gc_freeze else 'survivors frozen every second of event time, as the agent'}")
    if args.input == "gpu-rate":
        path, n_built = gpu_rate_input(args)
    else:
        with timed() as build:
            info = cached_concatenation(args.events, cache_dir=args.cache_dir)
        print(f"recording: {info.path}\n  {info.copies} time-shifted copies, {info.events:,} events from "
              f"{sum(info.records.values()):,} records {info.records}, {info.span_s / 3600:.1f} h of receipt time "
              f"(ready in {build.wall_s:.1f} s)")
        path, n_built = info.path, info.events
    limit = args.full_events or None
    if limit is not None:
        n_built = min(n_built, limit)
        print(f"decode, timeline and full passes: the first {limit:,} events")

    with timed() as raw:
        n_raw = raw_pass(path)
    with timed() as dec:
        n_dec = decode_pass(path, limit)
    if args.decode_only:
        print(f"\n{'pass':<8}{'items':>12}{'wall s':>9}{'CPU s':>9}   rate (wall, CPU)")
        print(f"{'raw':<8}{n_raw:>12,}{raw.wall_s:>9.1f}{raw.cpu_s:>9.1f}   {_rate(n_raw, raw)}  records")
        print(f"{'decode':<8}{n_dec:>12,}{dec.wall_s:>9.1f}{dec.cpu_s:>9.1f}   {_rate(n_dec, dec)}")
        _goal_decode(n_dec, dec)
        if args.digest:
            n_dig, dec_digest = decode_digest(path, limit)
            print(f"decode digest: {dec_digest} ({n_dig:,} events)")
        return 0 if n_dec == n_built else 1
    tl_digest = hashlib.sha256() if args.digest else None
    prof = cProfile.Profile() if args.profile else None
    collector = Collector(not args.no_gc_freeze)
    with timed() as tl:
        if prof is not None and args.timeline_only:
            prof.enable()
        n_tl = timeline_pass(path, limit, tl_digest, collector)
    collected = {"timeline": collector.end()}
    digest = hashlib.sha256() if args.digest else None
    full, n_full, p, stats = None, n_tl, None, None
    if not args.timeline_only:
        collector = Collector(not args.no_gc_freeze)
        stats = RunStats() if args.run_stats else None
        with timed() as full, stats if stats is not None else nullcontext():
            if prof is not None:
                prof.enable()
            n_full, p = full_pass(path, digest, limit, collector)
        collected["full"] = collector.end()
    if prof is not None:
        prof.disable()
    if n_dec != n_full or n_full != n_built or n_tl != n_full:
        print(f"event counts differ: built {n_built}, decode {n_dec}, timeline {n_tl}, full {n_full}",
              file=sys.stderr)
        return 1

    print(f"\n{'pass':<8}{'items':>12}{'wall s':>9}{'CPU s':>9}   rate (wall, CPU)          vs decode")
    print(f"{'raw':<8}{n_raw:>12,}{raw.wall_s:>9.1f}{raw.cpu_s:>9.1f}   {_rate(n_raw, raw)}  records")
    print(f"{'decode':<8}{n_dec:>12,}{dec.wall_s:>9.1f}{dec.cpu_s:>9.1f}   {_rate(n_dec, dec)}  1.00")
    print(f"{'timeline':<8}{n_tl:>12,}{tl.wall_s:>9.1f}{tl.cpu_s:>9.1f}   {_rate(n_tl, tl)}  "
          f"{dec.wall_s / tl.wall_s:.2f} (CPU {dec.cpu_s / tl.cpu_s:.2f})")
    if full is not None:
        print(f"{'full':<8}{n_full:>12,}{full.wall_s:>9.1f}{full.cpu_s:>9.1f}   {_rate(n_full, full)}  "
              f"{dec.wall_s / full.wall_s:.2f} (CPU {dec.cpu_s / full.cpu_s:.2f})")
    for name, what in collected.items():
        print(f"collector in the {name} pass: {what}")
    if stats is not None:
        print(stats.report())
    timeline_cpu_s = max(tl.cpu_s - dec.cpu_s, 1e-9)
    print(f"\ntimeline alone (timeline - decode): {timeline_cpu_s:.1f} CPU s, {n_tl / timeline_cpu_s:,.0f} events/s")
    if full is not None and p is not None:
        pipeline_cpu_s = max(full.cpu_s - dec.cpu_s, 1e-9)
        print(f"pipeline alone (full - decode): {pipeline_cpu_s:.1f} CPU s, {n_full / pipeline_cpu_s:,.0f} events/s "
              f"(the timeline {min(timeline_cpu_s / pipeline_cpu_s, 1.0):.0%} of it); results {len(p.store):,} in "
              f"store, {sum(p.tally.requests.values()):,} final; vLLM restarts seen {p.vllm_restarts}; "
              f"peak RSS {peak_rss_mb():.0f} MB")
        print(f"sizes at the end: {pipeline_sizes(p)}")
        rate = n_full / full.wall_s
        ratio = dec.wall_s / full.wall_s
        _goal("events/s >= 100,000", rate >= GOAL_EVENTS_PER_S, f"{rate:,.0f}, {rate / GOAL_EVENTS_PER_S:.3f} x goal")
        _goal("full / decode >= 0.5", ratio >= GOAL_FLOOR_RATIO, f"{ratio:.2f}, {ratio / GOAL_FLOOR_RATIO:.2f} x goal")
    _goal_decode(n_dec, dec)
    tl_ratio = dec.cpu_s / tl.cpu_s
    _goal("timeline / decode >= 0.5 (CPU; the pipeline cannot beat its timeline)", tl_ratio >= GOAL_FLOOR_RATIO,
          f"{tl_ratio:.2f}, {tl_ratio / GOAL_FLOOR_RATIO:.2f} x goal")
    if tl_digest is not None:
        print(f"timeline digest: {tl_digest.hexdigest()[:16]}")
    if digest is not None and full is not None:
        print(f"results digest: {digest.hexdigest()[:16]}")
    if args.digest:
        n_dig, dec_digest = decode_digest(path, limit)
        print(f"decode digest: {dec_digest} ({n_dig:,} events)")
    if prof is not None:
        prof.dump_stats(args.profile)
        pstats.Stats(str(args.profile)).sort_stats("tottime").print_stats(15)
    if args.json is not None:
        args.json.write_text(json.dumps({
            "input": args.input, "events": n_full, "records": n_raw, "gc_freeze": not args.no_gc_freeze,
            "collector": collected,
            "raw": vars(raw), "decode": vars(dec), "timeline": vars(tl), "full": full and vars(full),
            "events_per_s": full and n_full / full.wall_s, "floor_ratio": full and dec.wall_s / full.wall_s,
            "timeline_floor_ratio_cpu": tl_ratio, "results": p and len(p.store), "peak_rss_mb": peak_rss_mb(),
            "digest": digest and full and digest.hexdigest(), "timeline_digest": tl_digest and tl_digest.hexdigest(),
        }, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
