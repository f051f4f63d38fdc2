"""Requests with n > 1 (parallel sampling) as the agent reports them: one result, one lifecycle and one status per
client request, made of its children's (docs/sources.md, "Requests with n > 1").

vLLM 0.32 runs each of the n children as an engine request of its own (`<i>_<id>-<8 hex>`), so the timeline keeps
them apart and says which child is whose (`client_of`, `children`), and the attributor attributes each child. This
module is the pipeline's part: it keeps the children's results until their client request is whole, combines them
by `attribution.result.client_result` (the result's arithmetic, written there once), and answers for a client
request, which has no lifecycle of its own, by its children. Pure: no clock; its maps are bounded.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Collection, Iterable
from dataclasses import replace

from attrib_agent.attribution.result import AttributionResult, client_result
from attrib_agent.timeline.engine_timeline import EngineTimeline
from attrib_agent.timeline.model import RequestLifecycle


def client_lifecycle(client_id: str, children: list[RequestLifecycle]) -> RequestLifecycle:
    """An n>1 client request's lifecycle from its children's, by `client_result`'s rules: it arrived with them,
    waited until the first was scheduled (its queue wait), had its first token with the first child's, ended with
    the last, and its output is every child's."""
    def first(values: Iterable[float | None]) -> float | None:
        return min((v for v in values if v is not None), default=None)

    ends = [k.finish_ts for k in children if k.finish_ts is not None]
    finish = max(ends) if len(ends) == len(children) else None
    tokens = [k.completion_tokens for k in children if k.completion_tokens is not None]
    return replace(children[0], request_id=client_id, arrival_ts=first(k.arrival_ts for k in children),
                   scheduled_ts=first(k.scheduled_ts for k in children),
                   first_token_ts=first(k.first_token_ts for k in children), finish_ts=finish,
                   aborted_ts=None if finish is not None else first(k.aborted_ts for k in children),
                   completion_tokens=sum(tokens) if len(tokens) == len(children) else None,
                   complete=all(k.complete for k in children), prefill_s=None, decode_s=None)


def client_status(children: Collection[str]) -> str:
    """An n>1 client request's status from its children's (`AttributionPipeline.status` values) while none is
    stored: running while a child is, else skipped or aborted as they were; unknown without children."""
    kids = set(children)
    return "unknown" if not kids else "running" if kids - {"skipped", "aborted"} else min(kids)


class ClientRequests:
    """The children's results filed under their client requests: the parts so far of the last `max_pending` client
    requests still waiting for a child, and each child filed -> its client id (the last `max_results`, as many as
    the store keeps results), so a child's id answers with its client request's result."""

    def __init__(self, max_results: int, max_pending: int) -> None:
        self.max_results = max_results
        self.max_pending = max_pending
        self._parts: OrderedDict[str, dict[str, AttributionResult]] = OrderedDict()
        self._filed: OrderedDict[str, str] = OrderedDict()
        self.dropped = 0  # client requests dropped waiting for a child (past max_pending)

    def __len__(self) -> int:
        """Client requests waiting for a child's result."""
        return len(self._parts)

    def filed(self) -> int:
        """Children filed under their client request that a lookup still answers."""
        return len(self._filed)

    def file(self, timeline: EngineTimeline, client_id: str, part: AttributionResult) -> AttributionResult:
        """The client request's one result with `part` (one child's) in it: final once every child the timeline
        holds has a final part (the caller stores it, and tallies it when final: it is final once)."""
        parts = self._parts.setdefault(client_id, {})
        self._parts.move_to_end(client_id)
        parts[part.request_id] = part
        self._filed[part.request_id] = client_id
        self._filed.move_to_end(part.request_id)
        while len(self._filed) > self.max_results:
            self._filed.popitem(last=False)
        combined = self._combine(timeline, client_id, parts)
        while len(self._parts) > self.max_pending:
            self._parts.popitem(last=False)
            self.dropped += 1
        return combined

    def close(self, timeline: EngineTimeline, filed: Collection[str]) -> list[AttributionResult]:
        """Client requests (other than those just `filed`) waiting only for children aborted since: final now, so
        none waits forever."""
        if not self._parts:
            return []
        return [self._combine(timeline, cid, parts) for cid, parts in list(self._parts.items())
                if cid not in filed and _done(timeline, cid, parts)]

    def forget(self, client_id: str) -> None:
        """The client request's result was made final without waiting for its children (a clock step)."""
        self._parts.pop(client_id, None)

    def _combine(self, timeline: EngineTimeline, client_id: str,
                 parts: dict[str, AttributionResult]) -> AttributionResult:
        """The client request's result from its children's parts so far, in child order; final when every part is
        and no other child of it can still finish (one aborted, or gone from the timeline, has no part)."""
        kids = timeline.children(client_id)
        order = [*kids, *(k for k in parts if k not in kids)]
        final = _done(timeline, client_id, parts)
        combined = client_result(client_id, [parts[k] for k in order if k in parts], final=final)
        if final:
            del self._parts[client_id]
        return combined

    def filed_under(self, request_id: str) -> str | None:
        """The client request a child's result was filed under (None for any other id, or one filed too long ago)."""
        return self._filed.get(request_id)

    def client_id(self, timeline: EngineTimeline, request_id: str) -> str:
        """The request the agent reports `request_id` under: an n>1 child's client request, else itself."""
        return self._filed.get(request_id) or timeline.client_of(request_id)

    @staticmethod
    def lifecycle(timeline: EngineTimeline, client_id: str) -> RequestLifecycle | None:
        """The lifecycle an n>1 client request's children make together while the timeline holds them (None for
        any other id)."""
        kids = [k for c in timeline.children(client_id) if (k := timeline.lifecycle(c)) is not None]
        return client_lifecycle(client_id, kids) if kids else None


def _done(timeline: EngineTimeline, client_id: str, parts: dict[str, AttributionResult]) -> bool:
    """Every part final, and every other child the timeline holds ended without one (aborted)."""
    return all(p.final for p in parts.values()) and not any(
        k not in parts and (lc := timeline.logged(k)) is not None and lc.aborted_ts is None
        for k in timeline.children(client_id))
