"""Culprit totals over windows of finish time, kept up to date as results come and go.

"Who caused the most slowdown in the last 5 minutes" summed every stored result on each call: ~100 ms
at 100,000 results, on the event loop that serves every other API call. Here results are filed in
buckets of finish time; a window asked for once keeps its culprits' totals over its whole buckets and is
moved bucket by bucket as time passes, while results that arrive, are replaced (partial -> final) or are
evicted update it at once. A query then reads the window's totals plus the results of its two edge
buckets, exactly as a scan of the store would (up to float rounding).

A culprit's weight is the victim seconds it cost: its TTFT blame plus its per-token ITL blame times the
victim's token gaps. Causes are split the way `attrib_attributed_slowdown_seconds_total` splits them (ITL
blame under `decode_batching`, blame without a traced mechanism under `other`), so they sum to its seconds.
"""

from __future__ import annotations

import heapq
import math
from collections import OrderedDict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Final

from attrib_agent.attribution.result import AttributionResult
from attrib_agent.attribution.result_pack import Stored, filed, finished_ts

DEFAULT_BUCKET_S: Final = 10.0
MAX_WINDOWS: Final = 4  # window lengths kept warm; each holds at most one entry per culprit in it
_EPS: Final = 1e-12  # what is left of a sum after its parts were taken out again


@dataclass
class CulpritTotal:
    """One culprit's blame summed over a window's victims."""

    request_id: str
    seconds: float = 0.0
    ttft_s: float = 0.0
    itl_s: float = 0.0  # per-token ITL blame times each victim's gaps: seconds
    victims: int = 0
    whale_votes: int = 0  # victims whose result flagged it a whale
    causes: dict[str, float] = field(default_factory=dict)

    @property
    def is_whale(self) -> bool:
        return self.whale_votes > 0

    def as_dict(self) -> dict[str, object]:
        causes = {k: v for k, v in self.causes.items() if v > _EPS}
        return {"request_id": self.request_id, "seconds": self.seconds, "ttft_s": self.ttft_s, "itl_s": self.itl_s,
                "victims": self.victims, "is_whale": self.is_whale,
                "causes": dict(sorted(causes.items(), key=lambda kv: -kv[1]))}


@dataclass(frozen=True)
class TopCulprits:
    culprits: list[CulpritTotal]
    results: int  # results read (victims finished in the window)
    partial_results: int


class _Totals:
    """Culprit totals over a set of results; results can be taken out again (sign -1)."""

    def __init__(self) -> None:
        self.by_culprit: dict[str, CulpritTotal] = {}
        self.results = 0
        self.partial = 0
        self.version = 0  # moves on every change
        self._ranked: tuple[int, int, list[str]] | None = None  # (version, k, ids) of the last `leaders`

    def leaders(self, k: int) -> list[str]:
        """Every culprit whose seconds reach the k-th largest: whoever is not among them is beaten by k others
        here. Kept until the totals change, which between two queries they mostly do not: new results finish
        in the newest bucket, an edge that each query reads afresh."""
        if self._ranked is None or self._ranked[:2] != (self.version, k):
            self._ranked = (self.version, k, _leaders({cid: t.seconds for cid, t in self.by_culprit.items()}, k))
        return self._ranked[2]

    def apply(self, r: Stored, sign: int) -> None:
        final, gaps, culprits = filed(r)  # (a packed result's culprits decoded, the rest of it not)
        self.version += 1
        self.results += sign
        self.partial += sign * (not final)
        for c in culprits:
            ttft, itl_per_token = c.numbers()[:2]  # one read of the packed culprit (result.py)
            itl = itl_per_token * gaps
            seconds = ttft + itl
            if seconds <= 0:
                continue
            t = self.by_culprit.get(c.request_id)
            if t is None:
                t = self.by_culprit[c.request_id] = CulpritTotal(c.request_id)
            t.victims += sign
            if t.victims == 0:  # its last victim left: drop it whole, rounding residue included
                del self.by_culprit[c.request_id]
                continue
            t.seconds += sign * seconds
            t.ttft_s += sign * ttft
            t.itl_s += sign * itl
            t.whale_votes += sign * c.is_whale
            for cause, secs in c.blame_by_cause(gaps).items():
                t.causes[cause] = t.causes.get(cause, 0.0) + sign * secs


class _Window:
    """Totals over the whole buckets lo..hi (inclusive)."""

    def __init__(self) -> None:
        self.lo, self.hi = 0, -1
        self.totals = _Totals()

    def covers(self, bucket: int) -> bool:
        return self.lo <= bucket <= self.hi


class CulpritWindows:
    """Results filed by finish-time bucket, and the culprit totals of the windows asked for (bounded)."""

    def __init__(self, bucket_s: float = DEFAULT_BUCKET_S, max_windows: int = MAX_WINDOWS) -> None:
        if not bucket_s > 0 or max_windows < 1:
            raise ValueError("bucket_s must be > 0 and max_windows >= 1")
        self.bucket_s = bucket_s
        self.max_windows = max_windows
        self._buckets: dict[int, dict[str, Stored]] = {}  # the store's own values (the same objects)
        self._windows: OrderedDict[float, _Window] = OrderedDict()

    def _bucket(self, ts: float) -> int:
        return math.floor(ts / self.bucket_s)

    def add(self, request_id: str, r: Stored, result: AttributionResult | None = None) -> None:
        """File the store's value `r`; `result`, when the caller holds it, is what `r` decodes to, read instead
        of decoding the culprits just packed (the store's put)."""
        b = self._bucket(finished_ts(r))
        self._buckets.setdefault(b, {})[request_id] = r
        for w in self._windows.values():
            if w.covers(b):
                w.totals.apply(r if result is None else result, +1)

    def remove(self, request_id: str, r: Stored) -> None:
        b = self._bucket(finished_ts(r))
        bucket = self._buckets.get(b)
        if bucket is None or bucket.pop(request_id, None) is None:
            return
        if not bucket:
            del self._buckets[b]
        for w in self._windows.values():
            if w.covers(b):
                w.totals.apply(r, -1)

    def __len__(self) -> int:
        return sum(len(b) for b in self._buckets.values())

    @property
    def windows(self) -> int:
        return len(self._windows)

    def top(self, since: float, until: float, limit: int) -> TopCulprits:
        """Culprits of the victims that finished in [since, until], by seconds caused (largest first, ties by
        id), at most `limit`."""
        if limit < 1:
            raise ValueError("limit must be >= 1")
        first, last = self._bucket(since), self._bucket(until)
        lo = first if first * self.bucket_s >= since else first + 1  # whole buckets only
        hi = last - 1  # the bucket holding `until` may hold later results: an edge, read result by result
        window = self._moved(round(until - since, 6), lo, hi)
        edges = _Totals()
        for b in {first, last}:
            if not lo <= b <= hi:
                for r in self._buckets.get(b, {}).values():
                    if since <= finished_ts(r) <= until:
                        edges.apply(r, +1)
        inner, outer = window.totals.by_culprit, edges.by_culprit
        # Only the window's leaders and the edges' culprits can make the top: any other has fewer seconds than
        # `limit` leaders inside the window already, and the edges only add seconds.
        seconds = {}
        for cid in (*window.totals.leaders(limit), *outer):
            t, e = inner.get(cid), outer.get(cid)
            seconds[cid] = (t.seconds if t is not None else 0.0) + (e.seconds if e is not None else 0.0)
        ranked = _top_ids(seconds, limit)
        out = [_merged(cid, (inner.get(cid), outer.get(cid))) for cid in ranked]
        return TopCulprits(out, window.totals.results + edges.results, window.totals.partial + edges.partial)

    def _moved(self, key: float, lo: int, hi: int) -> _Window:
        """The window of this length, moved to whole buckets lo..hi: the buckets it leaves taken out and those it
        enters added, or rebuilt from its buckets when that touches fewer results."""
        w = self._windows.pop(key, None)
        if w is None:
            w = _Window()
            while len(self._windows) >= self.max_windows:
                self._windows.popitem(last=False)
        self._windows[key] = w
        if (w.lo, w.hi) == (lo, hi):
            return w
        inside = self._buckets_in(lo, hi)
        leaving = [b for b in self._buckets_in(w.lo, w.hi) if not lo <= b <= hi]
        entering = [b for b in inside if not w.covers(b)]
        if self._size(leaving) + self._size(entering) < self._size(inside):
            self._apply(w, leaving, -1)
            self._apply(w, entering, +1)
        else:
            w.totals = _Totals()
            self._apply(w, inside, +1)
        w.lo, w.hi = lo, hi
        return w

    def _size(self, buckets: list[int]) -> int:
        return sum(len(self._buckets[b]) for b in buckets)

    def _buckets_in(self, lo: int, hi: int) -> list[int]:
        if hi < lo:
            return []
        if hi - lo + 1 <= len(self._buckets):
            return [b for b in range(lo, hi + 1) if b in self._buckets]
        return [b for b in self._buckets if lo <= b <= hi]

    def _apply(self, w: _Window, buckets: Iterable[int], sign: int) -> None:
        for b in buckets:
            for r in self._buckets[b].values():
                w.totals.apply(r, sign)


def top_of(results: Iterable[Stored], limit: int) -> TopCulprits:
    """The same answer from a plain scan of `results` (the reference the windows are checked against)."""
    totals = _Totals()
    for r in results:
        totals.apply(r, +1)
    ranked = _top_ids({cid: t.seconds for cid, t in totals.by_culprit.items()}, limit)
    return TopCulprits([totals.by_culprit[cid] for cid in ranked], totals.results, totals.partial)


def _leaders(seconds: dict[str, float], k: int) -> list[str]:
    """Ids whose seconds reach the k-th largest (more than k on ties), largest first, ties by id."""
    if not seconds:
        return []
    threshold = heapq.nlargest(k, seconds.values())[-1]
    candidates = [(-s, cid) for cid, s in seconds.items() if s >= threshold]
    candidates.sort()
    return [cid for _, cid in candidates]


def _top_ids(seconds: dict[str, float], limit: int) -> list[str]:
    """Ids of the `limit` largest, ties by id."""
    return _leaders(seconds, limit)[:limit]


def _merged(cid: str, parts: tuple[CulpritTotal | None, CulpritTotal | None]) -> CulpritTotal:
    out = CulpritTotal(cid)
    for t in parts:
        if t is None:
            continue
        out.seconds += t.seconds
        out.ttft_s += t.ttft_s
        out.itl_s += t.itl_s
        out.victims += t.victims
        out.whale_votes += t.whale_votes
        for k, v in t.causes.items():
            out.causes[k] = out.causes.get(k, 0.0) + v
    return out


__all__ = ["CulpritTotal", "CulpritWindows", "TopCulprits", "top_of"]
