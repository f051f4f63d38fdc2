"""The render cache must never serve a body built at another state version, nor one older than its max age."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from attrib_agent.sinks.api.render_cache import Body, RenderCache


def test_reused_only_at_the_same_version() -> None:
    version = [0]
    builds: list[str] = []
    cache: RenderCache[str] = RenderCache(lambda: version[0])

    def build(tag: str) -> str:
        builds.append(tag)
        return f"{tag}@{version[0]}"

    assert cache.get("q", lambda: build("q")) == "q@0"
    assert cache.get("q", lambda: build("q")) == "q@0"
    assert cache.get("other", lambda: build("other")) == "other@0"
    version[0] += 1  # an event fed: every body is stale
    assert cache.get("q", lambda: build("q")) == "q@1"
    assert builds == ["q", "other", "q"]
    assert (cache.hits, cache.misses) == (1, 3)


def test_max_age_and_bounded() -> None:
    now = [0.0]
    cache: RenderCache[int] = RenderCache(lambda: 0, max_entries=2, max_age_s=1.0, clock=lambda: now[0])
    n = iter(range(100))
    first = cache.get("a", lambda: next(n))
    now[0] = 1.0
    assert cache.get("a", lambda: next(n)) == first
    now[0] = 1.5
    assert cache.get("a", lambda: next(n)) != first  # older than a second: rebuilt
    cache.get("b", lambda: next(n))
    cache.get("c", lambda: next(n))
    assert len(cache) == 2
    with pytest.raises(ValueError):
        RenderCache(lambda: 0, max_entries=0)


def test_max_stale_serves_a_body_of_an_older_version_while_young() -> None:
    version, now = [0], [0.0]
    cache: RenderCache[int] = RenderCache(lambda: version[0], max_stale_s=1.0, clock=lambda: now[0])
    n = iter(range(100))
    first = cache.get("a", lambda: next(n))
    version[0] += 5  # events fed: the body is of an older state, but younger than a second
    now[0] = 0.9
    assert cache.get("a", lambda: next(n)) == first
    now[0] = 1.1
    rebuilt = cache.get("a", lambda: next(n))
    assert rebuilt != first
    now[0] = 5.0  # old, but of the current version: still the state's body
    assert cache.get("a", lambda: next(n)) == rebuilt
    with pytest.raises(ValueError):
        RenderCache(lambda: 0, max_stale_s=-1.0)


def test_a_body_is_gzipped_once_and_only_for_clients_that_take_it() -> None:
    import gzip

    big = Body(b'{"steps":[' + b'{"ts":1.0,"n":3},' * 500 + b"1]}")
    sent, headers = big.for_client("gzip, deflate")
    assert headers["Content-Encoding"] == "gzip" and gzip.decompress(sent) == big.raw
    assert big.for_client("br, gzip")[0] is sent  # compressed once, kept
    plain, headers = big.for_client("identity")
    assert plain is big.raw and "Content-Encoding" not in headers
    small = Body(b'{"a":1}')
    assert small.for_client("gzip") == (small.raw, {"Vary": "Accept-Encoding"})


def test_renderer_serves_the_last_body_while_the_next_is_built() -> None:
    """A body past its freshness but within serve_stale_s answers at once; its successor is built in the
    background (where the pipeline lives) and served next; a key never built waits, one build for all."""
    import threading

    from attrib_agent.sinks.api.render_cache import Renderer

    version, now, builds = [0], [0.0], []
    gate = threading.Event()
    gate.set()

    async def on_thread(fn: Any) -> Any:
        return await asyncio.to_thread(fn)

    def build() -> str:
        gate.wait(5)
        builds.append(version[0])
        return f"v{version[0]}"

    r: Renderer[str] = Renderer(lambda: version[0], on_thread, serve_stale_s=5.0, clock=lambda: now[0])

    async def main() -> None:
        a, b = await asyncio.gather(r.get("k", build), r.get("k", build))  # first: waits, one build shared
        assert (a, b, builds) == ("v0", "v0", [0])
        version[0], now[0] = 1, 1.0
        gate.clear()  # the next build is slow
        assert await asyncio.wait_for(r.get("k", build), 0.5) == "v0"  # stale, at once
        assert r.stale_served == 1
        gate.set()
        for _ in range(100):
            await asyncio.sleep(0.01)
            if builds == [0, 1]:
                break
        assert await r.get("k", build) == "v1"
        now[0] = 10.0
        version[0] = 2
        assert await r.get("k", build) == "v2"  # older than serve_stale_s: waits for its build
        version[0], now[0] = 3, 10.5
        assert await r.refresh() == 1 and builds[-1] == 3  # asked lately: rebuilt ahead of the next request
        assert await r.get("k", build) == "v3" and builds.count(3) == 1

    asyncio.run(main())


def test_metrics_endpoint_negotiates_like_prometheus_client() -> None:

    import httpx
    from prometheus_client import CollectorRegistry, Counter
    from prometheus_client.openmetrics.exposition import CONTENT_TYPE_LATEST as OPENMETRICS

    from attrib_agent.read_model import inline
    from attrib_agent.sinks.prometheus.exposition import MetricsEndpoint

    registry = CollectorRegistry()
    Counter("toy_total", "A toy.", registry=registry).inc(3)
    Counter("other_total", "Another.", registry=registry)
    app = MetricsEndpoint(registry, lambda: 0, inline, max_age_s=1.0)

    async def get(headers: dict[str, str], query: str = "") -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
            return await c.get("/metrics" + query, headers=headers)

    text = asyncio.run(get({}))
    assert text.headers["content-type"].startswith("text/plain") and "toy_total 3.0" in text.text
    om = asyncio.run(get({"accept": "application/openmetrics-text; version=1.0.0"}))
    assert om.headers["content-type"].startswith(OPENMETRICS) and om.text.endswith("# EOF\n")
    only = asyncio.run(get({}, "?name[]=toy_total"))
    assert "toy_total" in only.text and "other_total" not in only.text


def test_a_successor_built_within_fresh_wait_is_served_not_the_stale_body() -> None:
    """A read right after a change sees it when the pipeline thread builds the body promptly (a Prometheus
    scrape after a result turned final counts it); the stale body only when the build takes longer."""
    from attrib_agent.sinks.api.render_cache import Renderer

    version, now = [0], [0.0]

    async def on_thread(fn: Any) -> Any:
        return await asyncio.to_thread(fn)

    r: Renderer[str] = Renderer(lambda: version[0], on_thread, serve_stale_s=5.0, fresh_wait_s=2.0,
                                clock=lambda: now[0])

    async def main() -> None:
        assert await r.get("k", lambda: f"v{version[0]}") == "v0"
        version[0], now[0] = 1, 1.0
        assert await r.get("k", lambda: f"v{version[0]}") == "v1"
        assert r.stale_served == 0

    asyncio.run(main())
