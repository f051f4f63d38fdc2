"""`attrib-agent` under cProfile, one profile per thread: where a live agent's CPU goes, loop versus pipeline.

    python -m benchmarks._profiled_agent cpu OUT_DIR run --vllm-url ...   # then SIGTERM it like the agent
    python -m benchmarks._profiled_agent mem OUT_DIR run --vllm-url ...

cProfile profiles only the thread that enables it, so every thread started through `threading` (the pipeline's
ThreadPoolExecutor worker among them) enables its own profiler on its first profiled call; at exit each is written
to OUT_DIR/<thread name>.prof and summarised in OUT_DIR/summary.txt (top functions by own time and cumulative).
Profiling slows Python code ~1.5-2x: read the shares, not the absolute CPU. `mem`: tracemalloc snapshots every
MEM_EVERY_S; OUT_DIR/memory.txt has what grew most between the second snapshot and the last (by line and by file).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
import time
import tracemalloc
from pathlib import Path
from types import FrameType
from typing import Any

_profiles: dict[str, cProfile.Profile] = {}
_lock = threading.Lock()


def _start_here(frame: FrameType, event: str, arg: Any) -> None:
    """The first profiled call on a new thread: replace this hook with that thread's own cProfile."""
    sys.setprofile(None)
    prof = cProfile.Profile()
    with _lock:
        _profiles[f"{threading.current_thread().name}-{threading.get_ident()}"] = prof
    prof.enable()


def write(out: Path, top: int = 40) -> None:
    out.mkdir(parents=True, exist_ok=True)
    text = io.StringIO()
    with _lock:
        profiles = dict(_profiles)
    for name, prof in profiles.items():
        prof.disable()
        prof.dump_stats(out / f"{name}.prof")
        st = pstats.Stats(prof, stream=text)
        text.write(f"==== thread {name}: {st.total_tt:.2f} s profiled\n")  # type: ignore[attr-defined]
        st.sort_stats("tottime").print_stats(top)
        st.sort_stats("cumulative").print_stats(top)
    (out / "summary.txt").write_text(text.getvalue())


MEM_EVERY_S = 15.0


def _snapshots(out: Path, stop: threading.Event) -> None:
    """Every MEM_EVERY_S: what grew since the second snapshot (the first is taken as the stream starts); only what
    was allocated once tracing started is seen, which is what growth is made of."""
    snaps: list[tracemalloc.Snapshot] = []
    if stop.wait(MEM_EVERY_S):
        return
    tracemalloc.start(4)  # once the agent is up (tracing its imports slows start-up past the benchmark's wait)
    while not stop.wait(MEM_EVERY_S):
        snaps.append(tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)]))
        if len(snaps) < 2:
            continue
        base, last = snaps[1], snaps[-1]
        snaps[2:-1] = []
        text = [f"after {len(snaps)} snapshots, traced now {sum(s.size for s in last.statistics('filename')) / 1e6:.1f}"
                f" MB at {time.strftime('%H:%M:%S')}"]
        for key in ("lineno", "filename"):
            text.append(f"---- top growth by {key}")
            text += [str(d) for d in last.compare_to(base, key)[:30]]
        (out / "memory.txt").write_text("\n".join(text) + "\n")


def main() -> int:
    mode, out, cli_args = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if mode == "mem":
        out.mkdir(parents=True, exist_ok=True)
        stop = threading.Event()
        threading.Thread(target=_snapshots, args=(out, stop), daemon=True, name="tracemalloc").start()
        from attrib_agent.cli import main as cli_main
        try:
            return int(cli_main(cli_args) or 0)
        finally:
            stop.set()
    threading.setprofile(_start_here)
    main_prof = cProfile.Profile()
    _profiles[f"MainThread-{threading.get_ident()}"] = main_prof
    from attrib_agent.cli import main as cli_main

    main_prof.enable()
    try:
        return int(cli_main(cli_args) or 0)
    finally:
        main_prof.disable()
        write(out)


if __name__ == "__main__":
    sys.exit(main())
