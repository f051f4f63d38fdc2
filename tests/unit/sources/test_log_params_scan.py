"""`top_level_int` jumps between the characters it acts on instead of stepping through every one: on real
`Received request` params and on random strings made of those characters it answers as the char-by-char scan."""

from __future__ import annotations

import random
from pathlib import Path

from attrib_agent.recording import LOG, Recording
from attrib_agent.sources.log import patterns as p

RECORDINGS = Path(__file__).parents[2] / "fixtures" / "recordings"


def _reference(params: str, name: str, limit: int = 65_536) -> int | None:
    """The scan as first written: one character at a time."""
    depth, quote, i, n, key = 0, "", 0, min(len(params), limit), name + "="
    while i < n:
        c = params[i]
        if quote:
            if c == "\\":
                i += 2
                continue
            if c == quote:
                quote = ""
        elif c in "'\"":
            quote = c
        elif c in "([{":
            depth += 1
            if depth == 1 and c == "(" and params.startswith(key, i + 1):
                return p._int_at(params, i + 1 + len(key))
        elif c in ")]}":
            depth -= 1
            if depth <= 0:
                return None
        elif depth == 1 and c == "," and params.startswith(" " + key, i + 1):
            return p._int_at(params, i + 2 + len(key))
        i += 1
    return None


def _real_params() -> list[str]:
    out = []
    for name in ("shorts", "bench-mixed"):
        for rec in Recording(RECORDINGS / name).records(LOG):
            m = p.RECEIVED.search(rec["line"])
            if m:
                out.append(m["params"])
    return out


def test_real_params_read_alike() -> None:
    params = _real_params()
    assert len(params) > 50
    for text in params:
        for name in ("max_tokens", "n", "seed", "min_tokens"):
            assert p.top_level_int(text, name) == _reference(text, name), (name, text[:80])
    assert any(p.top_level_int(t, "max_tokens") is not None for t in params)


def test_random_strings_of_the_special_characters_read_alike() -> None:
    rng = random.Random(1414)
    pieces = ["(", ")", "[", "]", "{", "}", ",", "'", '"', "\\", " ", "max_tokens=", "7", "x", ", max_tokens=",
              "(max_tokens=", "12,", "None"]
    real = _real_params()[:20]
    for case in range(20_000):
        if case % 4 == 0 and real:  # a real one, cut or spliced
            base = rng.choice(real)
            cut = rng.randrange(len(base) + 1)
            text = base[:cut] + "".join(rng.choice(pieces) for _ in range(rng.randrange(4))) + base[cut:]
        else:
            text = "SamplingParams(" + "".join(rng.choice(pieces) for _ in range(rng.randrange(30)))
        limit = rng.choice((65_536, rng.randrange(1, 40)))
        assert p.top_level_int(text, "max_tokens", limit) == _reference(text, "max_tokens", limit), (text, limit)


def test_random_strings_without_quotes_read_alike() -> None:
    """Params without a quote take the bracket-only scan (`_unquoted_top_level_int`): it answers as the reference
    on nesting, closers, `(name=` and `, name=` at every depth, and a field cut by the limit."""
    rng = random.Random(2626)
    pieces = ["(", ")", "[", "]", "{", "}", ",", " ", "max_tokens=", "7", "x", ", max_tokens=", "(max_tokens=",
              "12,", "None", "\\", ", max_tokens=x", "max_tokens", ", max_tokens=3)"]
    real = [t for t in _real_params() if "'" not in t and '"' not in t][:20]
    assert real
    seen = set()
    for case in range(20_000):
        if case % 4 == 0:
            base = rng.choice(real)
            cut = rng.randrange(len(base) + 1)
            text = base[:cut] + "".join(rng.choice(pieces) for _ in range(rng.randrange(4))) + base[cut:]
        else:
            text = rng.choice(("SamplingParams(", "", "(", "x")) + "".join(
                rng.choice(pieces) for _ in range(rng.randrange(30)))
        limit = rng.choice((65_536, len(text), max(len(text) - 1, 1), rng.randrange(1, 40)))
        got = p.top_level_int(text, "max_tokens", limit)
        assert got == _reference(text, "max_tokens", limit), (text, limit)
        seen.add(got)
    assert {None, 7, 12} <= seen
