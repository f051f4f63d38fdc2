"""Rendered bodies kept per state version, so that the heavy reads (`/v1/timeline`, `/metrics`) are built once
per change of the agent's state, not once per request, on the event loop every other request waits for.

A body is reused while the pipeline's `version` (bumped by every event fed and every settle) is the one it was
built at and, with `max_age_s`, while it is younger than that (for bodies that also read the clock, e.g.
`/metrics`' lag and gap seconds). At most `max_entries` queries are kept (least recently used dropped).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Hashable
from typing import Generic, TypeVar

from starlette.types import ASGIApp, Message, Receive, Scope, Send

T = TypeVar("T")


class RenderCache(Generic[T]):
    def __init__(self, version: Callable[[], int], *, max_entries: int = 16, max_age_s: float | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_entries < 1:
            raise ValueError("max_entries must be >= 1")
        self._version, self._max, self._max_age_s, self._clock = version, max_entries, max_age_s, clock
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
        hit = self._entries.get(key)
        if hit is not None and hit[0] == self._version() and (
                self._max_age_s is None or self._clock() - hit[1] <= self._max_age_s):
            self._entries.move_to_end(key)
            self.hits += 1
            return hit[2]
        self.misses += 1
        return None

    def put(self, key: Hashable, body: T) -> None:
        """Keep `body` as built at the current version and time."""
        self._entries[key] = (self._version(), self._clock(), body)
        self._entries.move_to_end(key)
        while len(self._entries) > self._max:
            self._entries.popitem(last=False)

    def __len__(self) -> int:
        return len(self._entries)


class CachedAsgi:
    """An ASGI app (a GET endpoint whose answer depends only on the state, the query and `Accept`) answered from
    a RenderCache: the inner app runs on a miss and its response messages are replayed on hits."""

    def __init__(self, app: ASGIApp, cache: RenderCache[list[Message]]) -> None:
        self.app, self.cache = app, cache

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method", "GET") != "GET":
            await self.app(scope, receive, send)
            return
        accept = b",".join(v for k, v in scope.get("headers", ()) if k == b"accept")
        key = (scope.get("query_string", b""), accept)
        messages = self.cache.peek(key)
        if messages is None:
            messages = []

            async def keep(msg: Message) -> None:
                messages.append(msg)

            await self.app(scope, receive, keep)
            self.cache.put(key, messages)
        for msg in messages:
            await send(msg)
