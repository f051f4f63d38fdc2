"""Workload plans for the lab: request classes, arrival schedules and named scenarios.

Pure data and arithmetic: a plan is computed before any request is sent, so the same short-request
schedule can be replayed under every subset of whales (the counterfactual truth runs).
"""

from __future__ import annotations

import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace


@dataclass(frozen=True)
class RequestClass:
    """A size class of request; the four siso/silo/liso/lilo classes plus whales."""

    name: str
    prompt_tokens: int
    output_tokens: int
    is_whale: bool = False


# Short/long input x short/long output, sized for the lab's tiny model and 8k context.
SISO = RequestClass("siso", prompt_tokens=32, output_tokens=32)
SILO = RequestClass("silo", prompt_tokens=32, output_tokens=256)
LISO = RequestClass("liso", prompt_tokens=1024, output_tokens=32)
LILO = RequestClass("lilo", prompt_tokens=1024, output_tokens=256)


def whale(prompt_tokens: int, output_tokens: int) -> RequestClass:
    return RequestClass("whale", prompt_tokens=prompt_tokens, output_tokens=output_tokens, is_whale=True)


def decoy(prompt_tokens: int, output_tokens: int) -> RequestClass:
    """A long-running but cheap request: removed like a whale in the truth runs, to check it gets no blame."""
    return RequestClass("decoy", prompt_tokens=prompt_tokens, output_tokens=output_tokens, is_whale=True)


@dataclass(frozen=True)
class RequestSpec:
    """One planned request: a stable id (the same across counterfactual runs) and its send offset."""

    spec_id: str
    klass: RequestClass
    offset_s: float
    # "completions": random token ids (exact lengths, no text); "text": a text prompt to /v1/completions;
    # "chat": a text message to /v1/chat/completions. Text prompts carry the run's privacy canary.
    api: str = "completions"
    # Shared leading segments (name, tokens), e.g. a system prompt then a document: requests naming the same
    # segments start with the same token ids in a run (vLLM's prefix cache hits them); the rest is the request's own.
    prefix: tuple[tuple[str, int], ...] = ()
    n: int = 1  # parallel sampling (`"n"` in the body): vLLM runs n child engine requests of the class's output

    @property
    def is_whale(self) -> bool:
        return self.klass.is_whale


@dataclass(frozen=True)
class Scenario:
    name: str
    description: str
    requests: tuple[RequestSpec, ...]
    # A run is over when every request finished or this many seconds passed since the start.
    timeout_s: float = 120.0
    tags: tuple[str, ...] = field(default_factory=tuple)

    @property
    def whales(self) -> tuple[RequestSpec, ...]:
        return tuple(r for r in self.requests if r.is_whale)

    @property
    def shorts(self) -> tuple[RequestSpec, ...]:
        return tuple(r for r in self.requests if not r.is_whale)

    def with_whales(self, keep: Iterable[str]) -> Scenario:
        """The same scenario with only the named whales kept (shorts unchanged)."""
        kept = set(keep)
        unknown = kept - {w.spec_id for w in self.whales}
        if unknown:
            raise ValueError(f"scenario {self.name!r} has no whale(s) {sorted(unknown)}")
        reqs = tuple(r for r in self.requests if not r.is_whale or r.spec_id in kept)
        label = "+".join(sorted(kept)) or "none"
        return replace(self, name=f"{self.name}[{label}]", requests=reqs)


def scripted(prefix: str, klass: RequestClass, start_s: float, every_s: float, count: int) -> list[RequestSpec]:
    """Evenly spaced arrivals: deterministic, so every run sees the same schedule."""
    return [RequestSpec(f"{prefix}{i:03d}", klass, round(start_s + i * every_s, 6)) for i in range(count)]


def poisson(
    prefix: str,
    mix: Sequence[tuple[RequestClass, float]],
    rate_per_s: float,
    count: int,
    seed: int,
    start_s: float = 0.0,
) -> list[RequestSpec]:
    """Poisson arrivals with classes drawn from a weighted mix; seeded, so reruns are identical."""
    if rate_per_s <= 0:
        raise ValueError("rate_per_s must be positive")
    rng = random.Random(seed)
    classes = [c for c, _ in mix]
    weights = [w for _, w in mix]
    t = start_s
    out = []
    for i in range(count):
        t += rng.expovariate(rate_per_s)
        klass = rng.choices(classes, weights)[0]
        out.append(RequestSpec(f"{prefix}{i:03d}", klass, round(t, 6)))
    return out


def shared_prefix(
    prefix: str, klass: RequestClass, segments: Sequence[Sequence[tuple[str, int]]], rate_per_s: float, count: int,
    seed: int, start_s: float = 0.0,
) -> list[RequestSpec]:
    """Poisson arrivals of one class, each request carrying one of `segments` (drawn uniformly, seeded): RAG-style
    traffic where every prompt is a shared system prompt and document plus its own question."""
    rng = random.Random(seed)
    out = []
    for spec in poisson(prefix, [(klass, 1.0)], rate_per_s, count, seed, start_s):
        segs = tuple(rng.choice(segments))
        if sum(n for _, n in segs) >= klass.prompt_tokens:
            raise ValueError(f"the prefix {segs} leaves nothing of {klass.name}'s own prompt")
        out.append(replace(spec, prefix=segs))
    return out


# Seed 002's four shapes as `lab bench --dataset mixed` draws them (tests/fixtures/recordings/bench-mixed).
SEED2_MIX: tuple[tuple[RequestClass, float], ...] = ((SISO, 0.5), (SILO, 0.125), (LISO, 0.22), (LILO, 0.145))
RAG = RequestClass("rag", prompt_tokens=1_856, output_tokens=32)  # 256 system + 1,536 document + 64 question
RAG_PREFIXES = tuple((("system", 256), (f"doc{i}", 1_536)) for i in range(3))


MARGINAL_BASE = RequestClass("base", prompt_tokens=32, output_tokens=3000)  # the decodes every step is timed on
MARGINAL_K = (1, 4, 8)  # extra decoders per burst
MARGINAL_CHUNKS = (256, 1024)  # one prefill of this many tokens (1 output token) beside the base decodes


def marginal_plan(rounds: int = 5, every_s: float = 0.9) -> list[RequestSpec]:
    """Two long decodes (the same all run) and, `every_s` apart, a burst of k 32/24 decoders or one prefill alone
    beside them: the step time of the same decodes with and without k more decoding requests or one chunk
    (`lab marginal` reads it). Rounds repeat the schedule, so a run carries its own repetitions."""
    out = [RequestSpec("b000", MARGINAL_BASE, 0.2), RequestSpec("b001", MARGINAL_BASE, 0.3)]
    at = 2.0
    for r in range(rounds):
        for k in MARGINAL_K:
            out += [RequestSpec(f"k{k}r{r}d{i}", RequestClass(f"dec{k}", 32, 24), at) for i in range(k)]
            at += every_s
        for n in MARGINAL_CHUNKS:
            out.append(RequestSpec(f"p{n}r{r}", RequestClass(f"pre{n}", n, 1), at))
            at += every_s
    return out


def _scenario(name: str, description: str, reqs: Iterable[RequestSpec], **kw: object) -> Scenario:
    ordered = tuple(sorted(reqs, key=lambda r: (r.offset_s, r.spec_id)))
    ids = [r.spec_id for r in ordered]
    if len(ids) != len(set(ids)):
        raise ValueError(f"duplicate spec ids in scenario {name}")
    return Scenario(name, description, ordered, **kw)  # type: ignore[arg-type]


def _shorts(count: int = 20, every_s: float = 0.5, start_s: float = 1.0) -> list[RequestSpec]:
    return scripted("s", SISO, start_s, every_s, count)


SCENARIOS: dict[str, Scenario] = {
    s.name: s
    for s in (
        _scenario("shorts", "20 short requests alone: the null run, no interference expected", _shorts()),
        _scenario(
            "whale1",
            "20 shorts beside one 7,600/400 whale: prefill contention, but its KV alone never fills the pool",
            [*_shorts(count=20, every_s=0.25, start_s=0.6), RequestSpec("w1", whale(7600, 400), 0.5)],
        ),
        _scenario(
            "whale2",
            "20 shorts beside two whales (6,000/600 and 5,000/600): each fits alone, together they fill KV",
            [*_shorts(), RequestSpec("w1", whale(6000, 600), 0.5), RequestSpec("w2", whale(5000, 600), 2.0)],
        ),
        _scenario(
            "preempt",
            "20 shorts beside three whales whose KV outgrows the pool: vLLM preempts",
            # The whales arrive together, so all three are admitted (3 x 3,900 prompt tokens fit the 12,288-token
            # pool) and then outgrow it (3 x 4,700) whatever the machine's speed: preemption comes from token
            # counts, not timing. (Spaced 0.4 s apart they never overlapped on a CPU 5x faster at decoding.)
            [
                *_shorts(count=20, every_s=0.25, start_s=0.5),
                RequestSpec("w1", whale(3900, 800), 0.2),
                RequestSpec("w2", whale(3900, 800), 0.25),
                RequestSpec("w3", whale(3900, 800), 0.3),
            ],
        ),
        _scenario(
            "preempt-spaced",
            "20 shorts beside three 3,900/500 whales 0.4 s apart: the committed preempt fixture's shape",
            # The shape tests/fixtures/recordings/preempt was recorded with. Whether it preempts depends on the
            # machine's decode speed (the whales must overlap), which is why `preempt` now sends them together.
            [*_shorts(), *(RequestSpec(f"w{i}", whale(3900, 500), at) for i, at in ((1, 0.2), (2, 0.6), (3, 1.0)))],
        ),
        _scenario(
            "preempt-midstream",
            "12 shorts (32/256) decoding beside two 5,600/400 whales that fill the KV: shorts preempted mid-stream",
            # 2 x 5,600 prompt tokens take 88 of the 95 usable 128-token blocks; the shorts, admitted while the whales
            # prefill and decode, hold the rest. When a whale needs a block vLLM preempts the most recently admitted
            # running request: a short that already streams tokens. Either whale alone leaves the pool half free.
            [*scripted("s", SILO, 0.6, 0.3, 12), RequestSpec("w1", whale(5600, 400), 0.2),
             RequestSpec("w2", whale(5600, 400), 0.25)],
        ),
        _scenario(
            "decoy",
            "20 shorts beside a real whale (6,000/16) and a decoy (32/1,500): long-running but cheap, no KV pressure",
            # The decoy decodes all through the whale's prefill and the shorts (one token per step: it costs them
            # ~nothing) and outlives everyone; both together hold ~7,600 of the 12,288-token pool.
            [*_shorts(count=20, every_s=0.25, start_s=0.6), RequestSpec("d1", decoy(32, 1500), 0.3),
             RequestSpec("w1", whale(6000, 16), 0.5)],
        ),
        _scenario(
            "mixed",
            "Poisson mix of siso/silo/liso/lilo at 2 req/s beside two whales",
            [
                *poisson("m", [(SISO, 0.55), (SILO, 0.15), (LISO, 0.2), (LILO, 0.1)], 2.0, 30, seed=7),
                RequestSpec("w1", whale(3900, 300), 1.0),
                RequestSpec("w2", whale(2500, 300), 5.0),
            ],
        ),
        _scenario(
            "continuous",
            "Poisson traffic of seed 002's four shapes at 1 req/s for ~45 s (never idle), two whales mid-stream",
            [*poisson("c", SEED2_MIX, 1.0, 40, seed=2), RequestSpec("w1", whale(3900, 300), 15.0),
             RequestSpec("w2", whale(2500, 300), 27.0)],
        ),
        _scenario(
            "prefix",
            "40 RAG requests (256-token system prompt + one of 3 1,536-token documents + 64 own tokens) at 1.5 req/s "
            "beside a real whale 3x their prompts (5,568 tokens, the system prompt its only shared part)",
            # Prefix hits are ~90 % of the shorts' prompt tokens; the whale's own 5,312 tokens nobody reads.
            [*shared_prefix("r", RAG, RAG_PREFIXES, 1.5, 40, seed=2),
             RequestSpec("w1", whale(3 * RAG.prompt_tokens, 64), 9.0, prefix=(("system", 256),))],
        ),
        _scenario(
            "canary",
            "4 text prompts (2 completions, 2 chat) carrying a unique canary string, for privacy tests",
            [RequestSpec(f"t{i:03d}", SISO, 0.5 + 0.4 * i, api=("text", "chat")[i % 2]) for i in range(4)],
        ),
        _scenario(
            "kvpair",
            "two whales that fit the KV pool when admitted and outgrow it while decoding (a preemption), 4 shorts",
            # 2 x 5,600 prompt tokens fit the 95 usable 128-token blocks (88); at ~6,080 tokens each they do not.
            [RequestSpec("w1", whale(5600, 600), 0.2), RequestSpec("w2", whale(5600, 600), 0.25),
             *scripted("s", SISO, 0.6, 0.5, 4)],
        ),
        _scenario(
            "marginal",
            "2 long decodes; beside them, 0.9 s apart, bursts of 1, 4, 8 more decoders, then one 256- and"
            " 1,024-token prefill, 5 times: what a co-member adds to the same decodes' step time (`lab marginal`)",
            marginal_plan(),
        ),
        _scenario(
            "nseq",
            "20 shorts beside parallel-sampling requests: two 256/64 with n=3 and a 1,024/200 whale with n=4 (vLLM"
            " runs each child as its own engine request, `<i>_<id>-<hex>`, prefix shared, own decode blocks)",
            [*_shorts(), RequestSpec("p1", RequestClass("par", 256, 64), 2.0, n=3),
             RequestSpec("w1", whale(1024, 200), 3.5, n=4), RequestSpec("p2", RequestClass("par", 256, 64), 6.0, n=3)],
        ),
        _scenario(
            "smoke",
            "6 shorts arriving during one whale's long prefill: the shortest run that shows interference",
            [*_shorts(count=6, every_s=0.12, start_s=0.3), RequestSpec("w1", whale(7600, 100), 0.2)],
        ),
    )
}


def get_scenario(name: str) -> Scenario:
    try:
        return SCENARIOS[name]
    except KeyError:
        raise ValueError(f"unknown scenario {name!r}; known: {', '.join(sorted(SCENARIOS))}") from None


def prefixed_token_ids(spec: RequestSpec, run_tag: str, seed: int) -> list[int]:
    """A request's prompt: its shared segments (ids seeded by the run and the segment's name, so the same in one
    run and new in the next: every run starts with a cold cache) then its own random ids to the class's length."""
    ids: list[int] = []
    for name, n in spec.prefix:
        ids += prompt_token_ids(n, int.from_bytes(f"{run_tag}/{name}".encode(), "big") % 2**63)
    return ids + prompt_token_ids(spec.klass.prompt_tokens - len(ids), seed)


def prompt_token_ids(length: int, seed: int, low: int = 100, high: int = 8000) -> list[int]:
    """Random token ids: no shared prefix across runs, so vLLM's prefix cache never hides a prefill."""
    rng = random.Random(seed)
    return [rng.randrange(low, high) for _ in range(length)]
