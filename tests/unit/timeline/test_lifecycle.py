"""LifecycleBook: partial lifecycles from log lines, completed by spans; bounded; duplicates harmless."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from attrib_agent.events import RequestAborted, RequestAdded, RequestFailed, RequestReceived, RequestSpan
from attrib_agent.timeline.lifecycle import LifecycleBook, RequestEvent

T0 = 1_800_000_000.0


def received(rid: str, t: float, max_tokens: int | None = 16) -> RequestReceived:
    return RequestReceived(T0 + t + 0.001, T0 + t, rid, max_tokens)


def added(rid: str, t: float) -> RequestAdded:
    return RequestAdded(T0 + t + 0.003, T0 + t + 0.001, rid, rid + "-0123abcd")


def entered(book: LifecycleBook, rid: str, t: float, max_tokens: int | None = 16) -> None:
    """`Received` then `Added`: the request is in the engine."""
    book.feed(received(rid, t, max_tokens))
    book.feed(added(rid, t))


def span(rid: str, t: float, ttft: float = 0.05, e2e: float = 0.5) -> RequestSpan:
    return RequestSpan(T0 + t + e2e + 5.0, rid, "a" * 32, "b" * 16, T0 + t, T0 + t + e2e, 0.01, ttft, e2e, 0.04,
                       e2e - ttft, e2e - 0.01, 100, 16, 16)


def test_a_partial_lifecycle_is_completed_by_its_span() -> None:
    book = LifecycleBook()
    change = book.feed(received("a", 1.0))
    assert not change.new and "a" not in book  # not in the engine yet
    change = book.feed(RequestAdded(T0 + 1.003, T0 + 1.002, "a", "a-01234567"))
    assert change.new and not change.span_landed
    lc = book.get("a")
    assert lc is not None and not lc.complete and lc.arrival_ts == T0 + 1.0 and lc.max_tokens == 16
    assert lc.first_token_ts is None and lc.end_ts is None
    change = book.feed(span("a", 0.999))
    assert change.span_landed and not change.new
    lc = book.get("a")
    assert lc is not None and lc.complete
    assert lc.arrival_ts == T0 + 0.999  # vLLM's own arrival replaces the log line's
    assert lc.scheduled_ts == pytest.approx(T0 + 1.009) and lc.first_token_ts == pytest.approx(T0 + 1.049)
    assert lc.finish_ts == pytest.approx(T0 + 1.499) and lc.ttft_s == pytest.approx(0.05)
    assert lc.prompt_tokens == 100 and lc.completion_tokens == 16 and lc.mean_itl_s == pytest.approx(0.45 / 15)
    assert book.entry("a").queue_ts == T0 + 1.0  # type: ignore[union-attr]  # the queue order is kept


def test_a_span_alone_makes_a_complete_lifecycle() -> None:
    book = LifecycleBook()
    change = book.feed(span("x", 2.0))
    assert change.new and change.span_landed
    assert book.get("x").complete  # type: ignore[union-attr]


def test_aborts_and_failures_end_a_request_but_not_a_finished_one() -> None:
    book = LifecycleBook()
    entered(book, "a", 1.0)
    assert book.feed(RequestAborted(T0 + 2.1, T0 + 2.0, "a")).aborted
    assert book.get("a").end_ts == T0 + 2.0  # type: ignore[union-attr]
    entered(book, "b", 1.0)
    assert book.feed(RequestFailed(T0 + 3.1, None, "b", "ValueError")).aborted
    assert book.get("b").aborted_ts == T0 + 3.1  # type: ignore[union-attr]  # no log time: receipt time
    book.feed(span("c", 1.0))
    assert not book.feed(RequestAborted(T0 + 9.0, T0 + 9.0, "c")).aborted
    assert book.get("c").aborted_ts is None  # type: ignore[union-attr]


def test_queue_order_and_the_window_query() -> None:
    book = LifecycleBook()
    for rid, t in (("b", 2.0), ("a", 1.0), ("c", 3.0)):
        entered(book, rid, t)
    assert [lc.request_id for lc in book.lifecycles()] == ["a", "b", "c"]
    assert [e.lifecycle.request_id for e in book.queued_between(None, T0 + 2.5)] == ["a", "b"]
    first = book.entry("a")
    assert first is not None
    assert [e.lifecycle.request_id for e in book.queued_between((first.queue_ts, first.order), T0 + 9)] == ["b", "c"]


def test_the_book_is_bounded_and_evicts_ended_requests_first() -> None:
    book = LifecycleBook(max_requests=3)
    entered(book, "open-old", 0.0)
    book.feed(span("done", 1.0))
    entered(book, "open-2", 2.0)
    entered(book, "open-3", 3.0)
    assert len(book) == 3 and "done" not in book and "open-old" in book
    entered(book, "open-4", 4.0)
    assert len(book) == 3 and "open-old" not in book and book.evicted == 2
    with pytest.raises(ValueError):
        LifecycleBook(0)


def test_forget_ended_before() -> None:
    book = LifecycleBook()
    book.feed(span("old", 0.0))
    book.feed(span("new", 10.0))
    entered(book, "open", 0.0)
    assert book.forget_ended_before(T0 + 5.0) == 1
    assert "old" not in book and "new" in book and "open" in book


def _events() -> st.SearchStrategy[list[RequestEvent]]:
    ids = st.sampled_from(["a", "b", "c"])
    t = st.floats(0.0, 5.0, allow_nan=False)
    one = st.one_of(
        st.builds(received, ids, t),
        st.builds(lambda r, x: RequestAdded(T0 + x + 0.002, T0 + x, r, r + "-00000000"), ids, t),
        st.builds(lambda r, x: RequestAborted(T0 + x + 1, T0 + x + 1, r), ids, t),
        st.builds(span, ids, t),
    )
    return st.lists(one, max_size=12)


@settings(max_examples=300, deadline=None)
@given(_events())
def test_duplicated_events_change_nothing(evs: list[RequestEvent]) -> None:
    once, twice = LifecycleBook(), LifecycleBook()
    for ev in evs:
        once.feed(ev)
        twice.feed(ev)
        twice.feed(ev)
    assert once.lifecycles() == twice.lifecycles()


@settings(max_examples=300, deadline=None)
@given(_events(), st.integers(1, 3))
def test_bounded_whatever_arrives(evs: list[RequestEvent], bound: int) -> None:
    book = LifecycleBook(max_requests=bound)
    for ev in evs:
        book.feed(ev)
        assert len(book) <= bound
        # the list kept beside the queue (updated as lifecycles change) is the queue's entries' own, bounded too
        assert book.lifecycles() == [e.lifecycle for e in book.queued_between(None, float("inf"))]
        assert len(book.lifecycles()) <= bound
        # the index of those without a span (what `EngineTimeline.lifecycles` completes from the steps)
        assert sorted(book.incomplete(), key=lambda p: p[0]) == [(i, lc) for i, lc in enumerate(book.lifecycles())
                                                                 if not lc.complete]
        # every request without an end is among the open entries (the timeline's bound walks only those)
        assert {lc.request_id for lc in book.lifecycles() if lc.end_ts is None} <= \
            {e.lifecycle.request_id for e in book.open_entries()}
        assert [e.lifecycle for e in book.open_entries()] == [lc for _, lc in book.incomplete()]
        # the lookup by id (the preemption inference's, no dict built a pass) holds exactly what is listed
        assert dict(book.by_id()) == {lc.request_id: lc for lc in book.lifecycles()}
    book.forget_ended_before(T0 + 100.0)
    assert dict(book.by_id()) == {lc.request_id: lc for lc in book.lifecycles()}
    assert book.lifecycles() == [e.lifecycle for e in book.queued_between(None, float("inf"))]
    assert sorted(lc.request_id for _, lc in book.incomplete()) == sorted(lc.request_id for lc in book.lifecycles()
                                                                          if not lc.complete)


def test_a_request_received_but_never_added_is_not_in_the_book() -> None:
    """/tokenize (`tokenize-<hex>`) is classed at once; any other id waits for `Added` within the window."""
    book = LifecycleBook(admit_window_s=30.0)
    book.feed(received("tokenize-9f2c", 0.0, None))
    book.feed(received("cmpl-x-0", 0.5))
    assert len(book) == 0 and book.lifecycles() == [] and book.unadmitted() == 1 and book.non_generation == 1
    entered(book, "cmpl-y-0", 1.0)
    assert [lc.request_id for lc in book.lifecycles()] == ["cmpl-y-0"]
    book.feed(added("cmpl-x-0", 1.5))  # late `Added`: queued at its `Received` time, ahead of y
    assert [lc.request_id for lc in book.lifecycles()] == ["cmpl-x-0", "cmpl-y-0"]
    assert book.entry("cmpl-x-0").queue_ts == T0 + 0.5  # type: ignore[union-attr]
    book.feed(received("rejected-1", 2.0))
    book.feed(RequestAborted(T0 + 2.2, T0 + 2.1, "rejected-1"))  # aborted before it was added
    book.feed(received("lost-1", 3.0))
    assert book.unadmitted() == 1 and book.never_admitted == 1
    entered(book, "cmpl-z-0", 40.0)  # event time moves past lost-1's window
    assert book.unadmitted() == 0 and book.never_admitted == 2
    assert [lc.request_id for lc in book.lifecycles()] == ["cmpl-x-0", "cmpl-y-0", "cmpl-z-0"]


def test_received_ids_waiting_for_added_are_bounded() -> None:
    book = LifecycleBook(max_unadmitted=8)
    for i in range(1000):
        book.feed(received(f"pool-{i}", i * 0.001))
        assert book.unadmitted() <= 8
    assert book.never_admitted == 992 and len(book) == 0
    with pytest.raises(ValueError):
        LifecycleBook(max_unadmitted=0)


def test_an_n_gt_1_requests_children_are_lifecycles_of_their_own_and_take_its_spans_one_each() -> None:
    """vLLM 0.32 runs `"n": 3` as three engine requests `<i>_<id>` (the log parser names them so), each exporting
    a span named by the parent's id: each child takes the parent's `Received` line and one of its spans."""
    from attrib_agent.events import RequestAdded, RequestReceived, RequestSpan
    from attrib_agent.timeline.lifecycle import LifecycleBook

    book = LifecycleBook()
    book.feed(RequestReceived(ts=10.0, log_ts=10.0, request_id="cmpl-p-0", max_tokens=40))
    for i in range(3):
        change = book.feed(RequestAdded(ts=10.01, log_ts=10.01, request_id=f"{i}_cmpl-p-0",
                                        internal_id=f"{i}_cmpl-p-0-0000abcd"))
        assert change.new
    kids = ("0_cmpl-p-0", "1_cmpl-p-0", "2_cmpl-p-0")
    assert book.children("cmpl-p-0") == kids and "cmpl-p-0" not in book
    assert [lc.request_id for lc in book.lifecycles()] == list(kids)
    assert all(book.get(k).arrival_ts == 10.0 and book.get(k).max_tokens == 40 for k in kids)  # type: ignore[union-attr]
    assert book.unadmitted() == 0 and book.never_admitted == 0
    for k, e2e in enumerate((2.0, 2.5, 3.0)):
        span = RequestSpan(13.0 + k, "cmpl-p-0", "0" * 32, f"{k:016x}", 10.0, 10.0 + e2e, 0.1, 0.5, e2e, 0.4,
                           e2e - 0.6, e2e - 0.2, 256, 40, 40)
        change = book.feed(span)
        assert change.request_id == kids[k] and change.span_landed and book.last_span_request == kids[k]
    assert [book.get(k).finish_ts for k in kids] == [12.0, 12.5, 13.0]  # type: ignore[union-attr]
    again = book.feed(RequestSpan(14.0, "cmpl-p-0", "0" * 32, "f" * 16, 10.0, 13.0, 0.1, 0.5, 3.0, 0.4, 2.4, 2.8,
                                  256, 40, 40))
    assert not again.span_landed and [book.get(k).finish_ts for k in kids] == [12.0, 12.5, 13.0]  # type: ignore[union-attr]
    for k in kids:
        book.forget(k)
    assert book.children("cmpl-p-0") == () and len(book) == 0


def test_an_id_that_only_looks_like_a_child_is_an_ordinary_request() -> None:
    from attrib_agent.events import RequestAdded, RequestReceived
    from attrib_agent.timeline.lifecycle import LifecycleBook

    book = LifecycleBook()
    book.feed(RequestReceived(ts=1.0, log_ts=1.0, request_id="7_job", max_tokens=5))
    book.feed(RequestAdded(ts=1.0, log_ts=1.0, request_id="7_job", internal_id="7_job-0000abcd"))
    assert book.children("job") == () and book.get("7_job").max_tokens == 5  # type: ignore[union-attr]
