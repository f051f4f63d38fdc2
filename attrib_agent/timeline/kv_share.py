"""Shared prefix blocks counted once: each request's exclusive KV blocks, and the blocks several requests share.

vLLM's block pool hands a prefix-cache hit the very blocks another request computed (a reference count per
block), its usage gauge counts each physical block once, and a finished request's blocks that another still
references stay used. The step model names, for every running request with a hit, the request whose copy of
the prefix it shares (its *root*: the request that computed it if that still runs, else the earliest hitter;
`StepOutcome.prefix_shares`, decided in timeline/steps.py). Within one root's group the holders reference a
nested run of the same blocks: the root its whole holding, a hitter its hit blocks. A block referenced by two
or more holders is *shared* (drawn once, charged to none); the rest are a holder's *exclusive* blocks: what
vLLM would free were that request alone removed. With holders' prefix sizes p1 >= p2 >= ..., the group shares
p2 blocks and holder r keeps `held_r - min(p_r, largest other p)`; summed with the shared blocks this is
`sum(held) - (p2 + p3 + ...)`, the step model's count of distinct blocks (`predicted_blocks`).

An n>1 request's children (`<i>_<id>`) are one holder, their client request: vLLM frees the prompt they share only
when all of them go, so its blocks are theirs, counted once (on the child holding the longest run: the one that
computed it), and shared only with other holders. A holder's run is its children's longest; each other child's
run is a copy within it. Exact mode (timeline/exact.py) splits vLLM's own block counts by this same rule.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from attrib_agent.vllm_ids import CHILD_PREFIX

Holdings = Sequence[tuple[str, int]]
Shares = Sequence[tuple[str, str, int]]


@dataclass(frozen=True, slots=True)
class KvSplit:
    """One step's holdings split: blocks each request alone holds, and blocks held by several (counted once)."""

    exclusive: tuple[tuple[str, int], ...]  # in the holdings' order
    shared: int
    twice: int = 0  # blocks the holdings count more than once: sum(held) - total

    @property
    def total(self) -> int:
        return sum(b for _, b in self.exclusive) + self.shared


def split_holdings(holdings: Holdings, shares: Shares) -> KvSplit:
    """The split of one step (module docstring); without prefix hits every block is its holder's own."""
    if not shares:
        return KvSplit(tuple(holdings), 0)
    held = dict(holdings)
    groups: dict[str, dict[str, int]] = {}
    hitters = set()
    for rid, root, hit in shares:
        if rid in held:
            groups.setdefault(root, {})[rid] = min(hit, held[rid])
            hitters.add(rid)
    shared = 0
    taken: dict[str, int] = {}
    for root, members in groups.items():
        if root in held and root not in hitters:  # the request that computed the prefix, still running
            members[root] = held[root]
        if len(members) < 2:
            continue
        runs: dict[str, tuple[int, str]] = {}  # holder -> its longest run and the member holding it
        for rid, p in members.items():
            h = holder(rid)
            if h not in runs or p > runs[h][0]:
                runs[h] = (p, rid)
        sizes = sorted([run for run, _ in runs.values()], reverse=True) + [0]
        shared += sizes[1]
        for rid, p in members.items():
            run, lead = runs[holder(rid)]
            taken[rid] = p if rid != lead else min(run, sizes[1] if run == sizes[0] else sizes[0])
    if not taken:
        return KvSplit(tuple(holdings), 0)
    return KvSplit(tuple([(rid, b - taken.get(rid, 0)) for rid, b in holdings]), shared,
                   sum(taken.values()) - shared)


def holder(request_id: str) -> str:
    """Who would free a request's blocks: an n>1 request's child (`<i>_<id>`, only vLLM's fan-out makes such ids:
    its frontend prefixes a client's id with `cmpl-` or `chatcmpl-`) is its client request, anything else itself."""
    m = CHILD_PREFIX.fullmatch(request_id) if request_id[:1].isdigit() else None  # the usual id: no regex
    return request_id if m is None else m["parent"]
