"""/metrics bodies rebuilt ahead once per scrape interval, just before the next scrape, not every refresher tick."""

from __future__ import annotations

import asyncio

import httpx
from prometheus_client import CollectorRegistry, Counter

from attrib_agent.read_model import inline
from attrib_agent.sinks.prometheus.exposition import AHEAD_S, MetricsEndpoint


def test_a_steady_scraper_costs_one_ahead_build_per_interval() -> None:
    registry = CollectorRegistry()
    toy = Counter("toy_total", "A toy.", registry=registry)
    now, version = [0.0], [0]
    app = MetricsEndpoint(registry, lambda: version[0], inline, max_age_s=1.0, serve_stale_s=30.0,
                          clock=lambda: now[0])
    r = app.renderer

    async def scrape() -> str:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
            return (await c.get("/metrics")).text

    async def main() -> None:
        every = 5.0
        for n in range(4):  # a scraper every 5 s; the state changes all the time (a GPU-rate stream)
            now[0] = n * every
            toy.inc()
            version[0] += 1
            assert f"toy_total {n + 1}.0" in await scrape()  # each scrape sees the state at its time
            rebuilt = []
            for tick in range(1, int(every / 0.25)):  # the agent's refresher, every 0.25 s until the next scrape
                now[0] = n * every + tick * 0.25
                version[0] += 1
                if await r.refresh():
                    rebuilt.append(now[0])
            if n == 0:
                assert rebuilt == []  # one scrape: no interval known yet, nothing built ahead
            else:  # one build, AHEAD_S before the next scrape is due (was every tick: 19 builds)
                assert rebuilt == [n * every + every - AHEAD_S], rebuilt
        assert len(r.gaps) == 1

    asyncio.run(main())


def test_interval_memory_is_bounded_by_the_bodies_kept() -> None:
    registry = CollectorRegistry()
    app = MetricsEndpoint(registry, lambda: 0, inline, max_age_s=1.0)

    async def main() -> None:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://a") as c:
            for i in range(100):  # distinct bodies (name[] filters), each asked twice
                for _ in range(2):
                    await c.get(f"/metrics?name[]=s{i}")
        assert len(app.renderer.gaps) <= app.renderer.cache.max_entries

    asyncio.run(main())
