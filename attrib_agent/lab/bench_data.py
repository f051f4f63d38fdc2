"""Datasets for `vllm bench serve --dataset-name custom`: the lab's traffic shapes as text prompts.

vLLM's custom dataset is a JSONL of `{"prompt": ..., "output_tokens": N}` lines; with `--disable-shuffle`
the file order is the send order, and `--request-rate R` spaces the sends as a Poisson process. Two shapes:

- `mixed`: seed 002's four classes (siso/silo/liso/lilo, sized as in lab/workload.py) in a seeded random
  order, with whales placed mid-stream (at given fractions of the file, i.e. of the run);
- `rag`: one system prompt shared by every request, one of a few documents (RAG context) reused across
  requests, then a short question: vLLM's prefix cache serves most prompt tokens after each document's
  first use.

Prompts are pseudo-words of the lab tokenizer's own corpus, cut to the wanted token count with that
tokenizer (vLLM's server counts the same). No prompt text is secret: it is generated from a seed.
"""

from __future__ import annotations

import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from attrib_agent.lab.model import training_corpus
from attrib_agent.lab.workload import LILO, LISO, SILO, SISO, RequestClass, whale

# The "mixed" scenario's class mix (lab/workload.py): mostly short chat, some long-context.
MIX: tuple[tuple[RequestClass, float], ...] = ((SISO, 0.55), (SILO, 0.15), (LISO, 0.2), (LILO, 0.1))
WHALES: tuple[tuple[float, RequestClass], ...] = ((0.35, whale(3900, 300)), (0.6, whale(2500, 300)))


@dataclass(frozen=True)
class Row:
    klass: str
    prompt_tokens: int
    output_tokens: int
    prompt: str

    def line(self) -> str:
        return json.dumps({"prompt": self.prompt, "output_tokens": self.output_tokens, "klass": self.klass})


class TextMaker:
    """Text of exactly (or within a token of) N tokens under the lab tokenizer, from its seeded corpus."""

    def __init__(self, tokenizer_json: Path, seed: int) -> None:
        from tokenizers import Tokenizer

        self._tok = Tokenizer.from_file(str(tokenizer_json))
        self._words = " ".join(training_corpus(words=20_000, seed=seed)).split()
        self._rng = random.Random(seed)

    def count(self, text: str) -> int:
        return len(self._tok.encode(text, add_special_tokens=False).ids)

    def text(self, tokens: int) -> str:
        start = self._rng.randrange(len(self._words))
        words = [self._words[(start + i) % len(self._words)] for i in range(tokens)]  # >= 1 token per word
        ids = self._tok.encode(" ".join(words), add_special_tokens=False).ids[:tokens]
        return str(self._tok.decode(ids))


def mixed_rows(maker: TextMaker, count: int, seed: int,
               whales: Sequence[tuple[float, RequestClass]] = WHALES) -> list[Row]:
    """`count` requests of the four classes in a seeded order, with each whale at its fraction of the run."""
    rng = random.Random(seed)
    classes, weights = zip(*MIX, strict=True)
    rows = []
    for k in rng.choices(classes, weights=weights, k=count):
        rows.append(Row(k.name, k.prompt_tokens, k.output_tokens, maker.text(k.prompt_tokens)))
    for at, w in sorted(whales, key=lambda x: x[0], reverse=True):
        rows.insert(round(at * count), Row("whale", w.prompt_tokens, w.output_tokens, maker.text(w.prompt_tokens)))
    return rows


def rag_rows(maker: TextMaker, count: int, seed: int, *, system_tokens: int = 256, doc_tokens: int = 1536,
             docs: int = 3, question_tokens: int = 32, output_tokens: int = 32) -> list[Row]:
    """`count` requests: the shared system prompt, one of `docs` documents (seeded choice), a fresh question."""
    rng = random.Random(seed)
    system = maker.text(system_tokens)
    documents = [maker.text(doc_tokens) for _ in range(docs)]
    rows = []
    for _ in range(count):
        d = rng.randrange(docs)
        prompt = f"{system}\n\nDocument {d}:\n{documents[d]}\n\nQuestion: {maker.text(question_tokens)}"
        rows.append(Row(f"rag-doc{d}", maker.count(prompt), output_tokens, prompt))
    return rows


def write_rows(path: Path, rows: Sequence[Row]) -> dict[str, Any]:
    """Write the JSONL; returns a summary for the recording's meta (counts and token totals, no text)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(r.line() + "\n" for r in rows))
    by_class: dict[str, int] = {}
    for r in rows:
        by_class[r.klass] = by_class.get(r.klass, 0) + 1
    return {
        "requests": len(rows), "by_class": by_class,
        "whale_positions": [i for i, r in enumerate(rows) if r.klass == "whale"],
        "prompt_tokens": sum(r.prompt_tokens for r in rows), "output_tokens": sum(r.output_tokens for r in rows),
    }


def make_dataset(kind: str, path: Path, tokenizer_json: Path, count: int, seed: int = 2) -> dict[str, Any]:
    """Write dataset `kind` ("mixed" or "rag") of `count` requests to `path`."""
    maker = TextMaker(tokenizer_json, seed)
    if kind == "mixed":
        rows = mixed_rows(maker, count, seed)
    elif kind == "rag":
        rows = rag_rows(maker, count, seed)
    else:
        raise ValueError(f"unknown dataset {kind!r}; choose mixed or rag")
    return {"kind": kind, "seed": seed, **write_rows(path, rows)}
