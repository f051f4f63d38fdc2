"""Packed read-only maps for what every stored result repeats: a culprit's weights by cause and a result's
evidence by cause. At 100,000 results the plain dicts were the largest part of the store (~900 bytes a
result of ~2 KB, docs/performance.md section 5); packed, each map is one small object and one bytes.

Keys are codes into the fixed tables of cause and evidence names; a map with a key outside them (a journal
from a newer agent) or a value that is not a float is left as it was, so the JSON is always the dict's:
same keys, same order, same values to the bit.
"""

from __future__ import annotations

import struct
from collections.abc import ItemsView, Iterator, Mapping
from typing import ClassVar, Final, TypeVar

# The names' order is the wire format of nothing (maps are packed in memory only), but only ever append.
CAUSE_NAMES: Final = ("kv_pressure", "head_of_line", "prefill_contention", "decode_batching", "kv_bandwidth",
                      "preemption", "other")
EVIDENCE_NAMES: Final = ("simulated", "observed_steps", "observed_preemption", "cost_model", "nvml_bandwidth",
                          "observed_comembership")
V = TypeVar("V")
DOUBLE: Final = struct.Struct("<d")  # a packed number: a map's value, one of a culprit's four
_CAUSE_CODE: Final = {name: i for i, name in enumerate(CAUSE_NAMES)}
_EVIDENCE_CODE: Final = {name: i for i, name in enumerate(EVIDENCE_NAMES)}
NO_CAUSES: Final[Mapping[str, float]] = {}
NO_EVIDENCE: Final[Mapping[str, str]] = {}
"""The map of a culprit without causes (two thirds of them) and of a result without evidence: one shared
empty dict. Read-only like every result's maps; a plain dict so asdict/json take it as one."""


class _Packed(Mapping[str, V]):
    """Cause -> value: n cause codes, then n values of `_WIDTH - 1` bytes each, in one bytes."""

    __slots__ = ("_blob",)
    _WIDTH: ClassVar[int]

    def __init__(self, blob: bytes) -> None:
        self._blob = blob

    def __len__(self) -> int:
        return len(self._blob) // self._WIDTH

    def __iter__(self) -> Iterator[str]:
        return (CAUSE_NAMES[c] for c in self._blob[:len(self)])

    def __getitem__(self, key: str) -> V:
        n, code = len(self), _CAUSE_CODE.get(key)
        i = -1 if code is None else self._blob.find(code, 0, n)
        if i < 0:
            raise KeyError(key)
        return self._value(n, i)

    def _value(self, n: int, i: int) -> V:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"{type(self).__name__}({dict(self.items())!r})"

    def __reduce__(self) -> tuple[type[_Packed[V]], tuple[bytes]]:
        return type(self), (self._blob,)


class CauseMap(_Packed[float]):
    """Cause -> float (little-endian doubles)."""

    __slots__ = ()
    _WIDTH = 1 + DOUBLE.size

    def _value(self, n: int, i: int) -> float:
        value: float = DOUBLE.unpack_from(self._blob, n + DOUBLE.size * i)[0]
        return value

    def items(self) -> ItemsView[str, float]:
        return _CauseItems(self)

    def pairs(self) -> Iterator[tuple[str, float]]:
        n = len(self)
        return zip((CAUSE_NAMES[c] for c in self._blob[:n]), struct.unpack_from(f"<{n}d", self._blob, n), strict=True)


class _CauseItems(ItemsView[str, float]):
    """The items in one unpack rather than a lookup per key (culprit index, blame splits read them a lot)."""

    _mapping: CauseMap

    def __iter__(self) -> Iterator[tuple[str, float]]:
        return self._mapping.pairs()


class EvidenceMap(_Packed[str]):
    """Cause -> evidence name (its code)."""

    __slots__ = ()
    _WIDTH = 2

    def _value(self, n: int, i: int) -> str:
        return EVIDENCE_NAMES[self._blob[n + i]]


def compact_causes(m: Mapping[str, float]) -> Mapping[str, float]:
    """`m` packed (the shared empty map when empty), or `m` itself when it cannot be packed exactly."""
    if isinstance(m, CauseMap):
        return m
    if not m:
        return NO_CAUSES
    codes = [_CAUSE_CODE.get(k) for k in m]
    values = list(m.values())
    if None in codes or any(type(v) is not float for v in values):
        return m
    return CauseMap(bytes(codes) + struct.pack(f"<{len(values)}d", *values))  # type: ignore[arg-type]


def compact_evidence(m: Mapping[str, str]) -> Mapping[str, str]:
    """`m` packed (the shared empty map when empty), or `m` itself when it cannot be packed exactly."""
    if isinstance(m, EvidenceMap):
        return m
    if not m:
        return NO_EVIDENCE
    codes = [_CAUSE_CODE.get(k) for k in m]
    values = [_EVIDENCE_CODE.get(v) for v in m.values()]
    if None in codes or None in values:
        return m
    return EvidenceMap(bytes(codes) + bytes(values))  # type: ignore[arg-type]


# A packed culprit: its numbers, its two maps' lengths, then the maps' bytes (TTFT causes, ITL causes). The
# offsets are read from these structs (one definition of the layout), never written out.
_FOUR: Final = struct.Struct("<4d")  # ttft_s, itl_s, share, kv_block_seconds
_COUNTS: Final = struct.Struct("<BB")  # entries in the TTFT and in the ITL cause map
_NUMBERS: Final = struct.Struct(_FOUR.format + _COUNTS.format.removeprefix("<"))  # the two, at the start
_COUNTS_AT: Final = _FOUR.size


def pack_culprit(numbers: tuple[float, float, float, float], causes: Mapping[str, float],
                 itl_causes: Mapping[str, float]) -> bytes | None:
    """A culprit's four numbers and two cause maps in one bytes (~90 bytes, not tracked by the garbage
    collector); None when they cannot be packed exactly (a number not a float, a map with a foreign key)."""
    if any(type(x) is not float for x in numbers):
        return None
    maps = compact_causes(causes), compact_causes(itl_causes)
    blobs = [m._blob if isinstance(m, CauseMap) else b"" for m in maps]
    if any(m and not b for m, b in zip(maps, blobs, strict=True)):
        return None
    return _NUMBERS.pack(*numbers, len(maps[0]), len(maps[1])) + blobs[0] + blobs[1]


def culprit_size(blob: bytes, at: int = 0) -> int:
    """Bytes of the packed culprit that starts at `at` in `blob` (it is followed by others in a packed result)."""
    counts: tuple[int, int] = _COUNTS.unpack_from(blob, at + _COUNTS_AT)
    return _NUMBERS.size + CauseMap._WIDTH * (counts[0] + counts[1])


def culprit_numbers(blob: bytes) -> tuple[float, float, float, float]:
    """A packed culprit's numbers: ttft_s, itl_s, share, kv_block_seconds."""
    numbers: tuple[float, float, float, float] = _FOUR.unpack_from(blob)
    return numbers


def culprit_causes(blob: bytes, itl: bool) -> Mapping[str, float]:
    """A packed culprit's TTFT (or ITL) cause map, as a CauseMap over its part of the bytes."""
    n_ttft, n_itl = _COUNTS.unpack_from(blob, _COUNTS_AT)
    width = CauseMap._WIDTH
    start, n = (_NUMBERS.size + width * n_ttft, n_itl) if itl else (_NUMBERS.size, n_ttft)
    return CauseMap(blob[start:start + width * n]) if n else NO_CAUSES
