"""Rendered bodies kept per state version, so that the heavy reads (`/v1/timeline`, `/metrics`) are built once
per change of the agent's state, not once per request, on the event loop every other request waits for.

A body is reused while the pipeline's `version` (bumped by every event fed and every settle) is the one it was
built at and, with `max_age_s`, while it is younger than that (for bodies that also read the clock, e.g.
`/metrics`' lag and gap seconds). With `max_stale_s`, a body built at an older version is still reused while
younger than that: under a never-idle engine the version changes every few milliseconds, and a page polling
the timeline every few seconds does not need it rebuilt (20-50 ms on the loop) more than once a second. At most
`max_entries` queries are kept (least recently used dropped). A body is kept with its gzip, made once on first
demand (a 280 KB timeline: ~3 ms at level 6, 7 ms at Starlette's default 9, per request before).
`Renderer` builds them where the pipeline lives (the agent's pipeline thread) and serves the last one while
the next is built, so no request waits on the event loop for a rebuild.
"""

from __future__ import annotations

import asyncio
import contextlib
import gzip
import time
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Hashable
from typing import Any, Final, Generic, TypeVar

T = TypeVar("T")
GZIP_LEVEL: Final = 6  # zlib's default: 0.35 % bigger than 9 on the timeline, 2.4x faster
GZIP_MIN_BYTES: Final = 2048  # smaller bodies go as they are (as the API's GZipMiddleware does)


class Body:
    """A rendered body and its gzip, compressed on first demand and then kept with it."""

    __slots__ = ("raw", "_gzipped")

    def __init__(self, raw: bytes) -> None:
        self.raw = raw
        self._gzipped: bytes | None = None

    def gzipped(self) -> bytes:
        if self._gzipped is None:
            self._gzipped = gzip.compress(self.raw, compresslevel=GZIP_LEVEL, mtime=0)
        return self._gzipped

    def for_client(self, accept_encoding: str) -> tuple[bytes, dict[str, str]]:
        """The bytes to send a client with this Accept-Encoding, and the headers they need."""
        if "gzip" in accept_encoding and len(self.raw) >= GZIP_MIN_BYTES:
            return self.gzipped(), {"Content-Encoding": "gzip", "Vary": "Accept-Encoding"}
        return self.raw, {"Vary": "Accept-Encoding"}


class RenderCache(Generic[T]):
    def __init__(self, version: Callable[[], int], *, max_entries: int = 16, max_age_s: float | None = None,
                 max_stale_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1 or max_stale_s < 0:
            raise ValueError("max_entries must be >= 1 and max_stale_s >= 0")
        self._version, self._max, self._max_age_s, self._clock = version, max_entries, max_age_s, clock
        self._max_stale_s = max_stale_s
        self._entries: OrderedDict[Hashable, tuple[int, float, T]] = OrderedDict()
        self.hits = self.misses = 0

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        """The body for `key` at the current version: reused if built at this version (and young enough)."""
        body = self.peek(key)
        if body is None:
            body = build()
            self.put(key, body)
        return body

    def peek(self, key: Hashable) -> T | None:
        """The body kept for `key` if still valid (counted as a hit), else None (a miss: build and `put` it)."""
        if self.fresh(key):
            self._entries.move_to_end(key)
            self.hits += 1
            return self._entries[key][2]
        self.misses += 1
        return None

    def fresh(self, key: Hashable) -> bool:
        """Whether `peek(key)` would hit (not counted)."""
        hit = self._entries.get(key)
        if hit is None:
            return False
        age = self._clock() - hit[1]
        return (hit[0] == self._version() or age <= self._max_stale_s) and (
            self._max_age_s is None or age <= self._max_age_s)

    def entry(self, key: Hashable) -> tuple[int, float, T] | None:
        """(version, time built, body) kept for `key`, fresh or not."""
        return self._entries.get(key)

    @property
    def max_entries(self) -> int:
        return self._max

    def put(self, key: Hashable, body: T, version: int | None = None, at: float | None = None) -> None:
        """Keep `body` as built at `version` (default: the current one) and time `at` (default: now)."""
        self._entries[key] = (self._version() if version is None else version, self._clock() if at is None else at,
                              body)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class Renderer(Generic[T]):
    """Bodies built where the pipeline lives (`read`: the agent's pipeline thread) and served from the loop
    without waiting long for a rebuild: a body that is no longer fresh (RenderCache's rules) but younger than
    `serve_stale_s` is served if its successor, built in the background, takes over `fresh_wait_s` (a long
    pass holds the pipeline thread), and `refresh()` rebuilds ahead of time the bodies asked for in the last
    `hot_s`, each at most every `ahead_s` (0: whenever no longer fresh; a body whose inputs change with every
    event, like /metrics at GPU rates, would otherwise be rebuilt at every refresher tick for a scraper that
    comes every 15 s). A body older than `serve_stale_s` is never served: its request waits for the build. Only a
    query never asked before (or not for `serve_stale_s`) waits for its first build; concurrent requests for it
    share that one build."""

    def __init__(self, version: Callable[[], int], read: Callable[[Callable[[], Any]], Awaitable[Any]], *,
                 max_entries: int = 16, max_age_s: float | None = None, max_stale_s: float = 0.0,
                 serve_stale_s: float = 0.0, hot_s: float = 60.0, fresh_wait_s: float = 0.1, ahead_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.cache: RenderCache[T] = RenderCache(version, max_entries=max_entries, max_age_s=max_age_s,
                                                 max_stale_s=max_stale_s, clock=clock)
        self._version, self._read, self._clock = version, read, clock
        self._serve_stale_s, self._hot_s, self._fresh_wait_s = serve_stale_s, hot_s, fresh_wait_s
        self._ahead_s = ahead_s
        self._builds: dict[Hashable, asyncio.Future[T]] = {}
        self._asked: OrderedDict[Hashable, tuple[float, Callable[[], T]]] = OrderedDict()  # key -> (when, build)
        self.stale_served = self.builds = 0

    async def get(self, key: Hashable, build: Callable[[], T]) -> T:
        self._asked[key] = (self._clock(), build)
        self._asked.move_to_end(key)
        while len(self._asked) > self.cache.max_entries:
            self._asked.popitem(last=False)
        body = self.cache.peek(key)
        if body is not None:
            return body
        old = self.cache.entry(key)
        fut = self._builds[key] if key in self._builds else self._start(key, build)
        if old is not None and self._clock() - old[1] <= self._serve_stale_s:
            # The successor usually comes within a batch (ms): wait that long for it, so a read right after a
            # change sees the change; the old body only when the pipeline thread is in a long pass.
            with contextlib.suppress(TimeoutError):
                return await asyncio.wait_for(asyncio.shield(fut), self._fresh_wait_s)
            self.stale_served += 1
            return old[2]
        return await fut

    def _start(self, key: Hashable, build: Callable[[], T]) -> asyncio.Future[T]:
        async def run() -> T:
            try:
                self.builds += 1
                # the version and time the state is read at, there: a body's age counts from then
                built: tuple[int, float, T] = await self._read(lambda: (self._version(), self._clock(), build()))
                version, at, body = built
                self.cache.put(key, body, version, at)
                return body
            finally:
                self._builds.pop(key, None)

        fut = asyncio.ensure_future(run())
        fut.add_done_callback(lambda f: f.cancelled() or f.exception())  # a failed build is the requester's error
        self._builds[key] = fut
        return fut

    async def refresh(self) -> int:
        """Rebuild, one after another, the bodies asked for lately that are no longer fresh; how many were."""
        now, n = self._clock(), 0
        for key, (asked, build) in list(self._asked.items()):
            if now - asked > self._hot_s:
                del self._asked[key]
            elif key not in self._builds and not self.cache.fresh(key) and self._due(key, now):
                with contextlib.suppress(Exception):  # a failing build answers its next request with the error
                    await self._start(key, build)
                    n += 1
        return n

    def _due(self, key: Hashable, now: float) -> bool:
        kept = self.cache.entry(key)
        return kept is None or now - kept[1] >= self._ahead_s


async def refresh_forever(renderers: list[Renderer[Any]], stop: asyncio.Event, every_s: float) -> None:
    """Keep the hot bodies fresh until `stop` (the agent runs this beside its API)."""
    while not stop.is_set():
        for r in renderers:
            await r.refresh()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), every_s)
