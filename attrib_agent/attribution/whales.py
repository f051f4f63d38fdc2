"""The whale rule, once: a request whose KV footprint is a large share of the pool, or at least `factor` times the
median footprint of the recent requests it is compared with. The attributor compares a busy period's window (at
most `max_period_requests` requests, so never the median of a period that has not ended), the live KV view the
requests the timeline holds; each passes its own footprints and the pool.

A footprint is what a request really holds and computes: its uncached prompt tokens plus its outputs. A prompt
whose first tokens come from the prefix cache (a shared system prompt or document) holds those blocks in common
with the others that read them, so a short behind a long shared prefix is not a whale, and a long request among
them is, by what it adds."""

from __future__ import annotations

import statistics
from collections.abc import Mapping

POOL_SHARE = 0.125
"""A request whose footprint is at least this share of the KV pool is a whale whatever the traffic around it: eight
of them fill the pool, so it is among the few that can exhaust it (and hold others out of it)."""


def kv_footprint(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> int:
    """Tokens a request holds in the KV and computes: uncached prompt plus output (all of the prompt when the
    cached count is unknown)."""
    return max(0, prompt_tokens - max(0, cached_tokens)) + max(0, output_tokens)


def whales(footprints: Mapping[str, int], factor: float, pool_tokens: int | None = None,
           pool_share: float = POOL_SHARE) -> list[str]:
    """The whales among `footprints` (request id -> KV footprint in tokens), largest first (ties by id): a footprint
    >= `pool_share` x `pool_tokens` (when the pool is known), or >= `factor` x the median footprint."""
    if not footprints:
        return []
    median = statistics.median(footprints.values())
    bars = [factor * median] if median > 0 else []
    if pool_tokens:
        bars.append(pool_share * pool_tokens)
    if not bars:
        return []
    bar = min(bars)
    return sorted((rid for rid, f in footprints.items() if f >= bar), key=lambda rid: (-footprints[rid], rid))
