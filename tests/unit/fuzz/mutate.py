"""A small, fast, seeded mutation fuzzer: real inputs (from the committed recordings) cut, flipped, spliced and
grown, so each parser sees ≥ 10,000 cases in about a second where hypothesis would need a minute.

The seed is fixed, so CI runs the same cases every time; `Tally` counts where each case ended (parsed, typed
error, counted skip) and asserts the count, so a test that silently stops reaching its parser fails.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

CASES = 10_000
REPORTED: list[str] = []  # every Tally's line, for the terminal summary (conftest.py): CI shows the counts
# Bytes that tend to matter to parsers: separators, quotes, escapes, numbers at the edges, protobuf varint bits.
TOKENS: tuple[bytes, ...] = (
    b"\n", b"\r", b"\r\n", b"\x00", b" ", b"\t", b'"', b"\\", b"{", b"}", b"[", b"]", b"=", b",", b":", b"#",
    b"NaN", b"+Inf", b"-Inf", b"-1", b"0", b"1e309", b"18446744073709551616",
    b"\xff\xff\xff\xff\xff\xff\xff\xff\xff\x01",
    b"\x80", b"\xc3\x28", b"\xed\xa0\x80", "é".encode(), "\u2028".encode(), b"%s", b"..", b"null", b"true",
)


class Mutator:
    """Mutations of byte strings drawn from a corpus, from one fixed seed."""

    def __init__(self, corpus: Sequence[bytes], seed: int, tokens: Sequence[bytes] = TOKENS) -> None:
        if not corpus:
            raise ValueError("empty corpus")
        self.corpus = list(corpus)
        self.rng = random.Random(seed)
        self.tokens = list(tokens)

    def one(self, max_ops: int = 4) -> bytes:
        rng = self.rng
        data = bytearray(rng.choice(self.corpus))
        for _ in range(rng.randint(1, max_ops)):
            at = rng.randint(0, len(data))
            op = rng.randrange(8)
            if op == 0 and data:  # flip one byte
                data[min(at, len(data) - 1)] ^= rng.randint(1, 255)
            elif op == 1:  # truncate
                del data[at:]
            elif op == 2:  # splice another input's tail
                other = rng.choice(self.corpus)
                data[at:] = other[rng.randint(0, len(other)):]
            elif op == 3:  # insert a parser-relevant token
                data[at:at] = rng.choice(self.tokens)
            elif op == 4:  # insert random bytes
                data[at:at] = rng.randbytes(rng.randint(1, 16))
            elif op == 5:  # delete a run
                del data[at:at + rng.randint(1, 32)]
            elif op == 6:  # repeat a run (grows lengths, counts, nesting)
                run = data[at:at + rng.randint(1, 64)]
                data[at:at] = run * rng.randint(1, 8)
            else:  # overwrite one byte with a boundary value
                if data:
                    data[min(at, len(data) - 1)] = rng.choice((0, 1, 0x7F, 0x80, 0xFF))
        return bytes(data)

    def text(self, max_ops: int = 4) -> str:
        return self.one(max_ops).decode("utf-8", "replace")


@dataclass
class Tally:
    """Where each case ended, for the printed count and the ≥ CASES assertion."""

    parser: str
    outcomes: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: str) -> None:
        self.outcomes[outcome] += 1

    @property
    def cases(self) -> int:
        return sum(self.outcomes.values())

    def report(self, at_least: int = CASES, **counted: int) -> None:
        """Print and assert; `counted` holds extra figures (cases that reached a decoder) also held to `at_least`."""
        extra = "".join(f", {k} {v:,}" for k, v in counted.items())
        line = f"fuzz {self.parser}: {self.cases:,} cases ({dict(self.outcomes)}){extra}, 0 crashes"
        print("\n" + line)
        REPORTED.append(line)
        assert self.cases >= at_least, f"{self.parser}: only {self.cases} cases ran"
        for k, v in counted.items():
            assert v >= at_least, f"{self.parser}: only {v} cases counted as {k}"
