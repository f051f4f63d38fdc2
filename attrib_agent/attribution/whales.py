"""The whale rule, once: a request whose KV footprint is a large share of the pool, or at least `factor` times the
median footprint of the recent requests it is compared with. The attributor compares a busy period's window (at
most `max_period_requests` requests, so never the median of a period that has not ended), the live KV view the
requests the timeline holds; each passes its requests (`footprints`) and the pool.

A footprint is what a request alone holds and computes: its prompt and outputs less the prompt tokens it has in
common with others through vLLM's prefix cache. That is both the tokens it read from the cache (a shared system
prompt or document) and the tokens later requests read from it: the first of a prefix group computes the prefix,
but without it the next of the group would compute the same blocks, and while it runs it holds them in common with
the group. So neither the leader nor its peers of a shared-prefix group weigh more than their own suffixes and
outputs, and a request a few times longer than their prompts, whose tokens nobody else reads, is a whale."""

from __future__ import annotations

import statistics
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

POOL_SHARE = 0.125
"""A request whose footprint is at least this share of the KV pool is a whale whatever the traffic around it: eight
of them fill the pool, so it is among the few that can exhaust it (and hold others out of it)."""


@dataclass(frozen=True, slots=True)
class KvUse:
    """A request's token counts as far as the KV goes (cached: prompt tokens it read from the prefix cache)."""

    request_id: str
    prompt_tokens: int
    output_tokens: int
    cached_tokens: int = 0


def kv_footprint(prompt_tokens: int, output_tokens: int, cached_tokens: int = 0) -> int:
    """Tokens a request holds in the KV and computes with no later request reading its prefix: uncached prompt plus
    output (all of the prompt when the cached count is unknown)."""
    return max(0, prompt_tokens - max(0, cached_tokens)) + max(0, output_tokens)


def footprints(uses: Iterable[KvUse]) -> dict[str, int]:
    """Each request's footprint (request id -> tokens), `uses` in arrival order. The prompt tokens a request has in
    common with others are the more of what it read from the cache and the longest hit of a later request (at most
    its own prompt: an observer sees hits, not which prefix they hit, so a later hit is taken to be on this
    request's leading tokens when it could be; that under-weighs a long request by at most one later hit)."""
    ordered = list(uses)
    out: dict[str, int] = {}
    later_hit = 0
    for u in reversed(ordered):
        common = max(u.cached_tokens, min(later_hit, u.prompt_tokens))
        out[u.request_id] = kv_footprint(u.prompt_tokens, u.output_tokens, common)
        later_hit = max(later_hit, u.cached_tokens)
    return out


def client_uses(uses: Iterable[KvUse], client_of: Mapping[str, str]) -> list[KvUse]:
    """`uses` with an n>1 request's children (`client_of`: child id -> client id) as one use of its client request,
    at its first child's place: the whale rule judges what the client sent. vLLM caches a block when it allocates
    it (v1/core/kv_cache_manager.py:612-616), so the children after the first read the prompt's full blocks from
    the prefix cache: the prompt is held once (less what the first child read of others'), the outputs one each."""
    if not client_of:
        return list(uses)
    merged: dict[str, KvUse] = {}
    for u in uses:
        cid = client_of.get(u.request_id, u.request_id)
        got = merged.get(cid)
        merged[cid] = KvUse(cid, u.prompt_tokens, u.output_tokens, u.cached_tokens) if got is None else KvUse(
            cid, max(got.prompt_tokens, u.prompt_tokens), got.output_tokens + u.output_tokens,
            min(got.cached_tokens, u.cached_tokens))
    return list(merged.values())


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
