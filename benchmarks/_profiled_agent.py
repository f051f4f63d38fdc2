"""`attrib-agent` under cProfile, one profile per thread: where a live agent's CPU goes, loop versus pipeline.

    python -m benchmarks._profiled_agent cpu OUT_DIR run --vllm-url ...   # then SIGTERM it like the agent
    python -m benchmarks._profiled_agent mem OUT_DIR run --vllm-url ...

cProfile profiles only the thread that enables it, so every thread started through `threading` (the pipeline's
ThreadPoolExecutor worker among them) enables its own profiler on its first profiled call; at exit each is written
to OUT_DIR/<thread name>.prof and summarised in OUT_DIR/summary.txt (top functions by own time and cumulative).
Profiling slows Python code ~1.5-2x: read the shares, not the absolute CPU. `mem`: tracemalloc (one frame) from
MEM_BASE_S on, a base snapshot MEM_BASE_S later and one as the agent stops; OUT_DIR/memory.txt has what grew most
between them (by line and by file).
"""

from __future__ import annotations

import cProfile
import io
import pstats
import sys
import threading
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


MEM_BASE_S = 30.0  # tracing starts this long after the agent (its imports are not growth), the base snapshot
# this long after that; the last one is taken as the agent stops


def _trace(base: list[tracemalloc.Snapshot], stop: threading.Event) -> None:
    if stop.wait(MEM_BASE_S):
        return
    tracemalloc.start(1)
    if not stop.wait(MEM_BASE_S):
        base.append(_snapshot())


def _snapshot() -> tracemalloc.Snapshot:
    return tracemalloc.take_snapshot().filter_traces([tracemalloc.Filter(False, tracemalloc.__file__)])


def _growth(out: Path, base: list[tracemalloc.Snapshot]) -> None:
    if not base or not tracemalloc.is_tracing():
        return
    last = _snapshot()
    text = [f"traced {sum(s.size for s in base[0].statistics('filename')) / 1e6:.1f} MB at the base, "
            f"{sum(s.size for s in last.statistics('filename')) / 1e6:.1f} MB at the end"]
    for key in ("lineno", "filename"):
        text.append(f"---- top growth by {key}")
        text += [str(d) for d in last.compare_to(base[0], key)[:30]]
    (out / "memory.txt").write_text("\n".join(text) + "\n")


def main() -> int:
    mode, out, cli_args = sys.argv[1], Path(sys.argv[2]), sys.argv[3:]
    if mode == "mem":
        out.mkdir(parents=True, exist_ok=True)
        base: list[tracemalloc.Snapshot] = []
        stop = threading.Event()
        threading.Thread(target=_trace, args=(base, stop), daemon=True, name="tracemalloc").start()
        from attrib_agent.cli import main as cli_main
        try:
            return int(cli_main(cli_args) or 0)
        finally:
            stop.set()
            _growth(out, base)
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
