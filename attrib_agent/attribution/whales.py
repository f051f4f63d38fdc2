"""The whale rule, once: a request whose KV footprint is at least `factor` times the median footprint of the
requests it is compared with. The attributor compares a busy period's requests, the live KV view the
requests the timeline holds; each passes its own footprints."""

from __future__ import annotations

import statistics
from collections.abc import Mapping


def whales(footprints: Mapping[str, int], factor: float) -> list[str]:
    """The whales among `footprints` (request id -> KV footprint in tokens), largest first (ties by id)."""
    if not footprints:
        return []
    median = statistics.median(footprints.values())
    if median <= 0:
        return []
    return sorted((rid for rid, f in footprints.items() if f >= factor * median),
                  key=lambda rid: (-footprints[rid], rid))
