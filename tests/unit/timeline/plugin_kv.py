"""The step plugin's KV facts read straight from a recording, with none of the timeline's code: what each step
leaves held and each holder's distinct blocks, the references exact mode's holdings and block-seconds are
checked against (tests/unit/timeline/test_exact_kv.py, tests/unit/test_exact_mode_replay.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from attrib_agent.lab.step_truth import external_id
from attrib_agent.recording import VLLM_STEPS, Recording
from attrib_agent.vllm_ids import CHILD_PREFIX


def plugin_messages(path: Path) -> tuple[int, list[dict[str, Any]]]:
    """The pool's block size (the hello) and every step message, indexed or not, in order."""
    msgs = list(Recording(path).records(VLLM_STEPS))
    block_size = next(int(m["block_size"]) for m in msgs if m.get("kind") == "hello")
    return block_size, [m for m in msgs if m.get("kind") == "step"]


def held_after(steps: list[dict[str, Any]]) -> dict[int, dict[str, int]]:
    """By iteration: the step's blocks less the requests that finished at its end (the next schedule() call's
    `finished`, indexed or not: vLLM schedules once more after its last busy step)."""
    out: dict[int, dict[str, int]] = {}
    last: int | None = None
    for m in steps:
        if last is not None:
            for rid in m["finished"]:
                out[last].pop(external_id(rid), None)
        if isinstance(m.get("iter"), int):
            last = m["iter"]
            out[last] = {external_id(r): int(b) for r, b in m["blocks"].items()}
    return out


def hits_in_blocks(steps: list[dict[str, Any]], block_size: int) -> dict[str, int]:
    """Each request's prefix-cache hit (on the step that admitted it) in whole blocks."""
    return {external_id(s["id"]): s["hit"] // block_size for m in steps for s in m["scheduled"] if s.get("hit")}


def client(rid: str) -> str:
    m = CHILD_PREFIX.fullmatch(rid)
    return rid if m is None else m["parent"]


def distinct_by_client(blocks: Mapping[str, int], hits: Mapping[str, int]) -> dict[str, int]:
    """Blocks each client request holds, a prompt its n>1 children share counted once: each child references a
    run of the same prefix blocks (the one that computed it its whole table, a hitter its hit), so the children
    hold their tables less every run but the longest. Only right where no two client requests share a prefix."""
    groups: dict[str, list[tuple[int, int]]] = {}
    for rid, b in blocks.items():
        groups.setdefault(client(rid), []).append((b, min(hits[rid], b) if hits.get(rid) else b))
    return {c: sum(b for b, _ in rows) - sum(p for _, p in rows) + max(p for _, p in rows)
            for c, rows in groups.items()}
