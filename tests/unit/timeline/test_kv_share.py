"""Shared prefix blocks counted once (timeline/kv_share.py): the split of one step's holdings, and the ledger's
block-seconds of a request that shares its prefix (its exclusive blocks: what removing it alone frees)."""

from __future__ import annotations

import pickle
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.timeline.kv_share import split_holdings
from attrib_agent.timeline.ledger import KvBlockLedger, block_seconds
from attrib_agent.timeline.model import StepRecord
from attrib_agent.timeline.sched_state import Geometry, StepInput
from attrib_agent.timeline.step_outcome import StepOutcome

GEO = Geometry(block_size=16, num_blocks=65)


def test_hitters_share_the_running_roots_copy() -> None:
    """r computed a 14-block prefix and holds 16; a and b hit it: 14 blocks once, the rest each one's own."""
    s = split_holdings([("r", 16), ("a", 15), ("b", 16)], [("a", "r", 14), ("b", "r", 14)])
    assert s.shared == 14 and dict(s.exclusive) == {"r": 2, "a": 1, "b": 2}
    assert s.total == 47 - 28  # each physical block once: vLLM's count


def test_root_gone_the_hitters_still_share_one_copy() -> None:
    """vLLM keeps a block while any request references it: the hitters of a finished root share its copy."""
    s = split_holdings([("a", 15), ("b", 16)], [("a", "r", 14), ("b", "r", 14)])
    assert s.shared == 14 and dict(s.exclusive) == {"a": 1, "b": 2}


def test_a_lone_hitter_and_no_hits_share_nothing() -> None:
    lone = split_holdings([("a", 15), ("c", 4)], [("a", "r", 14)])
    assert lone.shared == 0 and dict(lone.exclusive) == {"a": 15, "c": 4}
    plain = split_holdings([("a", 3), ("c", 4)], [])
    assert plain.shared == 0 and plain.exclusive == (("a", 3), ("c", 4))


def test_nested_hits_the_longer_keeps_its_tail() -> None:
    """a hit 10 blocks of the prefix, b 14: blocks 0-9 are shared, 10-13 are b's alone."""
    s = split_holdings([("a", 12), ("b", 16)], [("a", "r", 10), ("b", "r", 14)])
    assert s.shared == 10 and dict(s.exclusive) == {"a": 2, "b": 6}


def test_two_prefixes_are_two_copies() -> None:
    s = split_holdings([("r1", 8), ("a", 8), ("r2", 8), ("b", 8)], [("a", "r1", 7), ("b", "r2", 7)])
    assert s.shared == 14 and dict(s.exclusive) == {"r1": 1, "a": 1, "r2": 1, "b": 1}


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30), st.sampled_from(["r", "s", "x"])), min_size=1,
                max_size=8), st.integers(1, 30))
def test_split_counts_each_block_once(hitters: list[tuple[int, int, str]], root_blocks: int) -> None:
    """Total = holdings minus the copies counted twice; no request's own blocks go negative or exceed its holding."""
    holdings = [("r", root_blocks)] + [(f"h{i}", held) for i, (held, _, _) in enumerate(hitters)]
    shares = [(f"h{i}", root, min(hit, held)) for i, (held, hit, root) in enumerate(hitters) if hit]
    s = split_holdings(holdings, shares)
    held = dict(holdings)
    assert all(0 <= b <= held[rid] for rid, b in s.exclusive)
    groups: dict[str, list[int]] = {}
    for _, root, hit in shares:
        groups.setdefault(root, []).append(hit)
    if "r" in groups:
        groups["r"].append(root_blocks)
    twice = sum(sum(p) - max(p) for p in groups.values())
    assert s.total == sum(held.values()) - twice and s.twice == twice


def test_an_n_gt_1_requests_children_are_one_holder() -> None:
    """Child 0 computed a 7-block prompt prefix (holds 10), children 1 and 2 hit it (hold 9): were the client
    request removed, vLLM would free all 14 blocks, so none is shared; child 0 carries the prompt."""
    s = split_holdings([("0_c", 10), ("1_c", 9), ("2_c", 9)], [("1_c", "0_c", 7), ("2_c", "0_c", 7)])
    assert s.shared == 0 and dict(s.exclusive) == {"0_c": 10, "1_c": 2, "2_c": 2}
    assert (s.total, s.twice) == (14, 14)


def test_children_and_another_request_share_the_prefix_once() -> None:
    """x also hit the children's prefix: its 7 blocks are shared by two holders, the client and x."""
    s = split_holdings([("0_c", 10), ("1_c", 9), ("2_c", 9), ("x", 8)],
                       [("1_c", "0_c", 7), ("2_c", "0_c", 7), ("x", "0_c", 7)])
    assert s.shared == 7 and dict(s.exclusive) == {"0_c": 3, "1_c": 2, "2_c": 2, "x": 1}
    assert (s.total, s.twice) == (15, 21)


def _blocks(holdings: list[tuple[str, int]], shares: list[tuple[str, str, int]]) -> dict[str, set[tuple[str, int]]]:
    """Each request's blocks by name, as vLLM's block tables hold them: a hit references the first blocks of its
    root's copy (the root's table, when it runs and hit nothing itself), the rest are its own."""
    held, hit = dict(holdings), {rid: (root, p) for rid, root, p in shares}
    out: dict[str, set[tuple[str, int]]] = {}
    for rid, b in holdings:
        if rid in hit:
            root, p = hit[rid]
            out[rid] = {(root, i) for i in range(min(p, b))} | {(rid, i) for i in range(min(p, b), b)}
        elif any(root == rid for root, _ in hit.values()):
            out[rid] = {(rid, i) for i in range(held[rid])}
        else:
            out[rid] = {(rid, i) for i in range(b)}
    return out


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 30), st.integers(0, 30), st.integers(0, 2), st.booleans()), min_size=1,
                max_size=8), st.integers(1, 30), st.booleans())
def test_each_holders_exclusive_blocks_are_what_removing_it_frees(
        hitters: list[tuple[int, int, int, bool]], root_blocks: int, root_is_child: bool) -> None:
    """Against the blocks named one by one: a holder (a request, or all of an n>1 request's children) keeps
    what no other holder references, and the shared blocks are those two or more reference."""
    r = "9_c" if root_is_child else "r"
    holdings = [(r, root_blocks)] + [(f"{i}_c" if child else f"h{i}", held)
                                     for i, (held, _, _, child) in enumerate(hitters)]
    shares = [(holdings[i + 1][0], (r, "s", "x")[g], min(hit, held))
              for i, (held, hit, g, _) in enumerate(hitters) if hit]
    s = split_holdings(holdings, shares)
    named = _blocks(holdings, shares)
    by_holder: dict[str, set[tuple[str, int]]] = {}
    for rid, blocks in named.items():
        by_holder.setdefault("c" if rid.endswith("_c") else rid, set()).update(blocks)
    refs: dict[tuple[str, int], int] = {}
    for blocks in by_holder.values():
        for blk in blocks:
            refs[blk] = refs.get(blk, 0) + 1
    own = {h: sum(refs[blk] == 1 for blk in blocks) for h, blocks in by_holder.items()}
    got: dict[str, int] = {}
    for rid, b in s.exclusive:
        got["c" if rid.endswith("_c") else rid] = got.get("c" if rid.endswith("_c") else rid, 0) + b
    assert got == own and s.shared == sum(n > 1 for n in refs.values()) and s.total == len(refs)


def _step(seq: int, end: float, holdings: dict[str, int], shares: tuple[tuple[str, str, int], ...]
          ) -> tuple[StepInput, StepOutcome]:
    si = StepInput(seq, 0, seq, end, 0.01, 0, 0, len(holdings), len(holdings), 0.0)
    rec = StepRecord(0, seq, end, 0.01, 0, 0, len(holdings), len(holdings), 0.0)
    return si, StepOutcome(rec, holdings=tuple(holdings.items()), prefix_shares=shares)


def test_a_sharers_block_seconds_are_its_exclusive_blocks() -> None:
    """A whale w computes a 20-block prefix, s hits it for 2 s: w frees only its 4 own blocks then; once w is
    gone s holds the whole copy alone."""
    steps = [_step(0, 10.0, {"w": 24}, ()),
             _step(1, 11.0, {"w": 24, "s": 21}, (("s", "w", 20),)),
             _step(2, 13.0, {"s": 22}, (("s", "w", 20),)),
             _step(3, 14.0, {}, ())]
    ledger = KvBlockLedger(GEO, steps, [], {})
    w, s = ledger.request("w"), ledger.request("s")
    assert w is not None and s is not None
    assert w.block_seconds == pytest.approx(24 * 1.0 + 4 * 2.0) and w.peak_blocks == 24
    assert s.block_seconds == pytest.approx(1 * 2.0 + 22 * 1.0) and s.peak_blocks == 22
    assert block_seconds(steps, ["w", "s"]) == {"w": w.block_seconds, "s": s.block_seconds}
    at = ledger.split_at(12.0)
    assert at.shared == 20 and dict(at.exclusive) == {"w": 4, "s": 1}


def test_a_steps_split_is_worked_out_once_and_left_out_of_what_the_outcome_is() -> None:
    """The ledger, the causes' pool and /v1/timeline all read a step's split, every pass: it is made on the first
    read and kept on the (immutable) outcome, yet an outcome's value, print and `replace` copies know nothing of it
    (a replaced outcome has other holdings: it splits them afresh)."""
    _, out = _step(1, 11.0, {"w": 24, "s": 21}, (("s", "w", 20),))
    printed = repr(out)
    first = out.kv_split()
    assert out.kv_split() is first and first == split_holdings(out.holdings, out.prefix_shares)
    assert (first.shared, first.twice, dict(first.exclusive)) == (20, 20, {"w": 4, "s": 1})
    assert repr(out) == printed and out == _step(1, 11.0, {"w": 24, "s": 21}, (("s", "w", 20),))[1]
    alone = replace(out, holdings=(("w", 24),), prefix_shares=())
    assert alone.kv_split() == split_holdings((("w", 24),), ()) and alone.kv_split().exclusive == (("w", 24),)
    assert pickle.loads(pickle.dumps(out)) == out
