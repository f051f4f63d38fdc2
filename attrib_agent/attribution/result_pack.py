"""A stored result in one bytes: what the result store keeps instead of the object, decoded on read.

A result as objects cost ~2.1 KB at GPU rates (6.6 culprits a result: each an object, its packed bytes and a
tuple slot; a dozen floats; the result object; its span ids as text), most of it per-object overhead. Packed it
is one bytes of ~0.6-0.8 KB, which the garbage collector does not track. `unpack` gives back an equal
AttributionResult (same values to the bit, same types), so the API's JSON, the journal and the culprit index
read what they read before.

Layout (little-endian; in memory only, never written anywhere, so it may change freely):
  header     finished_ts d, flags B, mode B (top bit: chosen_by "slowed"), engine H, prompt_tokens I,
             completion_tokens I, stored-float mask H, none-float mask H, evidence pairs B, culprits H
  sequences  H, when not 1 (flags: an n>1 client request's children, `AttributionResult.sequences`)
  ids        the trace id's 16 bytes and the span id's 8, each when present (flags)
  evidence   the EvidenceMap's bytes (cause codes, then evidence codes)
  floats     the FLOATS fields that are neither None nor +0.0 (0.0 is most slowdowns), in FLOATS order
  culprits   each: id length B, id UTF-8, is_whale B, its packed numbers and maps (compact.pack_culprit)
The request id is the store's key, not repeated here. A result that cannot be packed exactly (a number of
another type or out of range, a map with a foreign key, a span id that is not lowercase hex, an unknown mode)
is not packed: `pack` returns None and the store keeps the object.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Mapping
from typing import Any, Final

from attrib_agent.attribution.compact import EvidenceMap, culprit_size
from attrib_agent.attribution.result import NO_EVIDENCE, AttributionResult, Culprit, itl_gaps

Stored = bytes | AttributionResult
"""What the store holds for a result: packed, or (when it cannot be packed exactly) the object itself."""

FLOATS: Final = ("ttft_s", "ttft_baseline_s", "ttft_slowdown_s", "itl_s", "itl_baseline_s", "itl_slowdown_s",
                 "unexplained_ttft_s", "unexplained_itl_s", "quality", "arrival_ts", "preempted_s")
MODES: Final = ("inferred", "exact")
CHOSEN_BY: Final = ("share", "slowed")  # `AttributionResult.chosen_by`, in the mode byte's top bit
_SLOWED: Final = 0x80
_HEAD: Final = struct.Struct("<dBBHIIHHBH")
_FINISHED: Final = struct.Struct("<d")
_SEQUENCES_AT: Final = struct.Struct("<H")
_DOUBLES: Final = tuple(struct.Struct(f"<{n}d") for n in range(len(FLOATS) + 1))
_FINAL, _NO_INTERFERENCE, _WHALE, _TRACE, _SPAN, _PROMPT, _COMPLETION, _SEQUENCES = (1 << i for i in range(8))
_TRACE_BYTES, _SPAN_BYTES = 16, 8
_MODE_CODE: Final = {m: i for i, m in enumerate(MODES)}


def pack(r: AttributionResult) -> bytes | None:
    """`r` in one bytes (its request id aside), or None when it cannot be packed exactly."""
    if (type(r.finished_ts) is not float or r.mode not in _MODE_CODE or type(r.culprits) is not tuple
            or r.chosen_by not in CHOSEN_BY or len(r.culprits) > 0xFFFF
            or any(type(b) is not bool for b in (r.final, r.no_interference, r.is_whale))
            or not _uint(r.engine, 0xFFFF) or not _uint(r.sequences, 0xFFFF)
            or not all(x is None or _uint(x, 0xFFFFFFFF) for x in (r.prompt_tokens, r.completion_tokens))):
        return None
    trace, span, evidence = _hex(r.trace_id, _TRACE_BYTES), _hex(r.span_id, _SPAN_BYTES), _evidence(r.evidence)
    if trace is None or span is None or evidence is None:
        return None
    stored = none = 0
    values = []
    for i, name in enumerate(FLOATS):
        x = getattr(r, name)
        if x is None:
            none |= 1 << i
        elif type(x) is not float:
            return None
        elif x != 0.0 or math.copysign(1.0, x) < 0:  # (+0.0 is not stored; -0.0 is)
            stored |= 1 << i
            values.append(x)
    culprits = []
    for c in r.culprits:
        packed = _culprit(c)
        if packed is None:
            return None
        culprits.append(packed)
    flags = (_FINAL * r.final | _NO_INTERFERENCE * r.no_interference | _WHALE * r.is_whale
             | _TRACE * (r.trace_id is not None) | _SPAN * (r.span_id is not None)
             | _PROMPT * (r.prompt_tokens is not None) | _COMPLETION * (r.completion_tokens is not None)
             | _SEQUENCES * (r.sequences != 1))
    mode = _MODE_CODE[r.mode] | _SLOWED * (r.chosen_by == "slowed")
    head = _HEAD.pack(r.finished_ts, flags, mode, r.engine, r.prompt_tokens or 0,
                      r.completion_tokens or 0, stored, none, len(evidence) // EvidenceMap._WIDTH, len(culprits))
    sequences = _SEQUENCES_AT.pack(r.sequences) if r.sequences != 1 else b""
    return b"".join((head, sequences, trace, span, evidence, _DOUBLES[len(values)].pack(*values), *culprits))


def _uint(x: object, top: int) -> bool:
    return type(x) is int and 0 <= x <= top


def _hex(text: str | None, width: int) -> bytes | None:
    """A span id's bytes (b"" for None), or None when the text is not exactly their lowercase hex."""
    if text is None:
        return b""
    if type(text) is not str or len(text) != 2 * width:
        return None
    try:
        raw = bytes.fromhex(text)
    except ValueError:
        return None
    return raw if raw.hex() == text else None


def _evidence(m: Mapping[str, str]) -> bytes | None:
    if isinstance(m, EvidenceMap):
        return m._blob
    return b"" if m is NO_EVIDENCE else None


def _culprit(c: Culprit) -> bytes | None:
    rid = c.request_id
    if c._blob is None or type(rid) is not str or type(c.is_whale) is not bool:
        return None
    try:
        raw = rid.encode()
    except UnicodeEncodeError:  # (a lone surrogate)
        return None
    return b"".join((bytes((len(raw),)), raw, bytes((c.is_whale,)), c._blob)) if len(raw) <= 0xFF else None


def unpack(request_id: str, blob: bytes) -> AttributionResult:
    """The result `pack` packed in `blob`, equal to it to the bit."""
    finished, flags, mode, engine, prompt, completion, stored, none, n_ev, n_c = _HEAD.unpack_from(blob)
    evidence_at, floats_at, culprits_at = _sections(flags, n_ev, stored)
    ids_at = _ids_at(flags)
    trace_id = blob[ids_at:ids_at + _TRACE_BYTES].hex() if flags & _TRACE else None
    span_id = blob[evidence_at - _SPAN_BYTES:evidence_at].hex() if flags & _SPAN else None
    evidence = EvidenceMap(blob[evidence_at:floats_at]) if n_ev else NO_EVIDENCE
    values = iter(_DOUBLES[stored.bit_count()].unpack_from(blob, floats_at))
    f: list[Any] = [None if none >> i & 1 else next(values) if stored >> i & 1 else 0.0 for i in range(len(FLOATS))]
    return AttributionResult(
        request_id, finished, f[0], f[1], f[2], f[3], f[4], f[5], _culprits(blob, culprits_at, n_c), f[6],
        f[7], bool(flags & _NO_INTERFERENCE), f[8], bool(flags & _WHALE), engine, f[9],
        prompt if flags & _PROMPT else None, completion if flags & _COMPLETION else None, trace_id, span_id,
        bool(flags & _FINAL), f[10], evidence, MODES[mode & ~_SLOWED], _sequences(blob, flags),
        CHOSEN_BY[bool(mode & _SLOWED)])


def _sections(flags: int, n_evidence: int, stored: int) -> tuple[int, int, int]:
    """Where a packed result's evidence, floats and culprits start: the layout's order, in one place (the ids
    come first, after the header, each when its flag says it is there)."""
    evidence = _ids_at(flags) + _TRACE_BYTES * bool(flags & _TRACE) + _SPAN_BYTES * bool(flags & _SPAN)
    floats = evidence + EvidenceMap._WIDTH * n_evidence
    return evidence, floats, floats + _DOUBLES[stored.bit_count()].size


def _ids_at(flags: int) -> int:
    """Where a packed result's span ids start: past the header and its sequence count, when that is there."""
    return _HEAD.size + _SEQUENCES_AT.size * bool(flags & _SEQUENCES)


def _sequences(blob: bytes, flags: int) -> int:
    n: int = _SEQUENCES_AT.unpack_from(blob, _HEAD.size)[0] if flags & _SEQUENCES else 1
    return n


def _culprits(blob: bytes, at: int, n: int) -> tuple[Culprit, ...]:
    out = []
    for _ in range(n):
        size = blob[at]
        rid = blob[at + 1:at + 1 + size].decode()
        at += 1 + size
        whale = blob[at] == 1
        size = culprit_size(blob, at + 1)
        out.append(Culprit.packed(rid, whale, blob[at + 1:at + 1 + size]))
        at += 1 + size
    return tuple(out)


def finished_ts(v: Stored) -> float:
    """When the stored result's request finished (one read, no decoding)."""
    if type(v) is bytes:
        ts: float = _FINISHED.unpack_from(v)[0]
        return ts
    assert isinstance(v, AttributionResult)
    return v.finished_ts


def filed(v: Stored) -> tuple[bool, int, tuple[Culprit, ...]]:
    """(final, ITL gaps, culprits) of a stored result: what the culprit index reads, the rest not decoded."""
    if type(v) is not bytes:
        assert isinstance(v, AttributionResult)
        return v.final, v.itl_gaps, v.culprits
    _, flags, _, _, _, completion, stored, _, n_ev, n_c = _HEAD.unpack_from(v)
    culprits_at = _sections(flags, n_ev, stored)[2]
    gaps = itl_gaps(completion if flags & _COMPLETION else None, _sequences(v, flags))
    return bool(flags & _FINAL), gaps, _culprits(v, culprits_at, n_c)


def decoded(request_id: str, v: Stored) -> AttributionResult:
    """The stored result as an AttributionResult (a packed one decoded afresh)."""
    if type(v) is bytes:
        return unpack(request_id, v)
    assert isinstance(v, AttributionResult)
    return v


def stored_bytes(v: Stored) -> int:
    """Bytes the stored value holds: the packed bytes, or for an object kept whole the objects it holds."""
    if type(v) is bytes:
        return sys.getsizeof(v)
    return _object_bytes(v, set())


def _object_bytes(o: object, seen: set[int]) -> int:
    """sys.getsizeof summed over `o` and what it holds (slots, tuples, maps), each object once."""
    if id(o) in seen:
        return 0
    seen.add(id(o))
    n = sys.getsizeof(o)
    if isinstance(o, tuple | list):
        return n + sum(_object_bytes(x, seen) for x in o)
    if isinstance(o, dict):
        return n + sum(_object_bytes(k, seen) + _object_bytes(x, seen) for k, x in o.items())
    slots = [s for cls in type(o).__mro__ for s in _names(getattr(cls, "__slots__", ()))]
    return n + sum(_object_bytes(getattr(o, s), seen) for s in slots if hasattr(o, s))


def _names(slots: str | tuple[str, ...]) -> tuple[str, ...]:
    return (slots,) if isinstance(slots, str) else tuple(slots)
