"""vLLM 0.32's KV block pool and prefix cache (`vllm/v1/core/block_pool.py`), as far as scheduling sees it.

Blocks are counted, not named, except the ones a shared prefix can hit: a block of a request's group prefix
(`SimRequest.prefix_group`, its first `prefix_tokens // block_size` blocks) is a `SharedBlock` with a reference
count, found by (group, index) as vLLM finds it by its hash. Like vLLM, a block is hashed (cached) as soon as
a step schedules the tokens that fill it, so a request admitted in the same step already hits it; two requests
computing the same prefix block at once hold two copies and a lookup takes the first cached.
"""

from __future__ import annotations

from collections import deque

_NO_OWNER = -1


class _Seg:
    """A free-queue entry: `count` blocks of one owner (-1: anonymous), or one SharedBlock."""

    __slots__ = ("count", "key")

    def __init__(self, key: int | SharedBlock, count: int) -> None:
        self.key, self.count = key, count


class SharedBlock:
    """One physical block holding a group prefix's block `index`; free (evictable) when `ref` is 0."""

    __slots__ = ("entry", "group", "index", "ref")

    def __init__(self, group: str, index: int) -> None:
        self.group, self.index, self.ref = group, index, 1
        self.entry: _Seg | None = None  # its place in the free queue while ref == 0


class FreeBlockQueue:
    """vLLM's free-block queue: freed blocks join the back, allocation takes from the front (evicting whatever
    prefix-cache content those blocks held). Run-length encoded: [owner, count] segments for anonymous blocks
    and a request's own cached blocks, [SharedBlock, 1] for a group prefix's blocks; bounded by the pool size
    (touched entries are emptied in place and compacted away)."""

    def __init__(self, blocks: int, prefix_caching: bool = True) -> None:
        self.free = blocks
        self._caching = prefix_caching
        self._segments: deque[_Seg] = deque([_Seg(_NO_OWNER, blocks)] if blocks > 0 else [])
        self._cached: dict[int, _Seg] = {}  # owner -> its segment of still-cached own blocks
        self._shared: dict[str, dict[int, list[SharedBlock]]] = {}  # group -> index -> cached copies, in order
        self._empty = 0  # emptied entries still in the deque

    def __len__(self) -> int:
        return len(self._segments)

    def allocate(self, n: int) -> None:
        if n > self.free:
            raise ValueError(f"allocating {n} blocks with {self.free} free")
        self.free -= n
        while n > 0 or (self._segments and self._segments[0].count == 0):
            seg = self._segments[0]
            take = min(n, seg.count)
            seg.count -= take  # a cached segment loses its highest block index first (vLLM frees tail-first)
            n -= take
            if seg.count == 0:
                self._segments.popleft()
                key = seg.key
                if take == 0:
                    self._empty -= 1
                elif isinstance(key, SharedBlock):
                    self._evict(key)
                elif key != _NO_OWNER and self._cached.get(key) is seg:
                    del self._cached[key]

    def release(self, owner: int | None, blocks: int, full_blocks: int = 0,
                shared: list[SharedBlock] | None = None) -> None:
        """Free a request's `blocks` (its `shared` prefix blocks first, then its own), of which the first
        `full_blocks` are full (hashed). As vLLM's `BlockPool.free_blocks`, tail first: its own unhashed blocks
        join the front (reused first), its own hashed ones the back (reusable by `owner` if given, else by
        nobody), then its shared blocks that nobody else holds, last index first (the prefix's head is evicted
        last). With prefix caching off nothing is hashed."""
        shared = shared or []
        own = blocks - len(shared)
        if own > 0:
            self.free += own
            hashed = min(max(full_blocks - len(shared), 0), own) if self._caching else 0
            if own > hashed:
                first = self._segments[0] if self._segments else None
                if first is not None and first.key == _NO_OWNER and first.count:
                    first.count += own - hashed
                else:
                    self._segments.appendleft(_Seg(_NO_OWNER, own - hashed))
            if hashed and owner is not None:
                self.forget(owner)
                seg = _Seg(owner, hashed)
                self._segments.append(seg)
                self._cached[owner] = seg
            elif hashed:
                last = self._segments[-1] if self._segments else None
                if last is not None and last.key == _NO_OWNER and last.count:
                    last.count += hashed
                else:
                    self._segments.append(_Seg(_NO_OWNER, hashed))
        for block in reversed(shared):
            block.ref -= 1
            if block.ref == 0:
                block.entry = _Seg(block, 1)
                self._segments.append(block.entry)
                self.free += 1

    def peek_cached(self, owner: int, max_blocks: int) -> int:
        """How many of the owner's own cached blocks a lookup would hit (at most `max_blocks`)."""
        seg = self._cached.get(owner)
        return 0 if seg is None else min(seg.count, max(max_blocks, 0))

    def take_cached(self, owner: int, max_blocks: int) -> int:
        """Re-use the owner's cached blocks (at most `max_blocks`); returns how many blocks it got back."""
        seg = self._cached.pop(owner, None)
        if seg is None:
            return 0
        hit = min(seg.count, max(max_blocks, 0))
        self.free -= hit
        seg.count -= hit
        seg.key = _NO_OWNER  # the rest lies beyond the hit: nobody will find it again
        if seg.count == 0:
            self._drop(seg)
        return hit

    def forget(self, owner: int) -> None:
        seg = self._cached.pop(owner, None)
        if seg is not None:
            seg.key = _NO_OWNER

    def shared_hit(self, group: str, blocks: int) -> list[SharedBlock]:
        """The longest run of the group's cached prefix blocks 0, 1, ... (at most `blocks`), first copies."""
        copies = self._shared.get(group, {})
        hits = []
        for index in range(blocks):
            found = copies.get(index)
            if not found:
                break
            hits.append(found[0])
        return hits

    def touch(self, blocks: list[SharedBlock]) -> None:
        """A request takes these cached blocks: one more reference each, out of the free queue if free."""
        for block in blocks:
            if block.ref == 0 and block.entry is not None:
                block.entry.key, block.entry.count = _NO_OWNER, 0
                block.entry = None
                self.free -= 1
                self._empty += 1
            block.ref += 1
        if self._empty > 64 and self._empty > len(self._segments) // 2:
            self._segments = deque(s for s in self._segments if s.count)
            self._empty = 0

    def register(self, group: str, index: int) -> SharedBlock:
        """A block the request holds was just filled with the group prefix's block `index`: it is cached."""
        block = SharedBlock(group, index)
        self._shared.setdefault(group, {}).setdefault(index, []).append(block)
        return block

    def warm(self, group: str, blocks: int) -> None:
        """The group's first `blocks` prefix blocks were computed earlier and sit cached in the free queue."""
        self.allocate(blocks)
        self.release(None, blocks, blocks, [self.register(group, i) for i in range(blocks)])

    def _evict(self, block: SharedBlock) -> None:
        block.entry = None
        copies = self._shared.get(block.group, {})
        found = copies.get(block.index, [])
        if block in found:
            found.remove(block)
        if not found:
            copies.pop(block.index, None)

    def _drop(self, seg: _Seg) -> None:
        for i, s in enumerate(self._segments):
            if s is seg:
                del self._segments[i]
                return
