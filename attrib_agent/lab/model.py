"""A tiny Qwen2-style model directory made locally: config.json and a BPE tokenizer trained here.

Nothing comes from a model hub (none is reachable); vLLM serves it with `--load-format dummy`, i.e.
random weights, which is all the lab needs: real scheduling, real KV paging, real timings.
"""

from __future__ import annotations

import hashlib
import json
import random
from pathlib import Path
from typing import Any, Final

VOCAB_SIZE: Final = 8192
EOS_TOKEN: Final = "<|endoftext|>"

# 2 layers x (K,V) x 2 kv-heads x 64 head-dim x 4 bytes (float32) = 2,048 bytes of KV per token.
MODEL_CONFIG: Final[dict[str, Any]] = {
    "architectures": ["Qwen2ForCausalLM"],
    "model_type": "qwen2",
    "vocab_size": VOCAB_SIZE,
    "hidden_size": 256,
    "intermediate_size": 512,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 8192,
    "max_window_layers": 2,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "hidden_act": "silu",
    "initializer_range": 0.02,
    "tie_word_embeddings": True,
    "use_cache": True,
    "use_sliding_window": False,
    "sliding_window": None,
    "attention_dropout": 0.0,
    "bos_token_id": 0,
    "eos_token_id": 0,
    "torch_dtype": "float32",
}
KV_BYTES_PER_TOKEN: Final = 2 * 2 * 2 * 64 * 4

# A plain chat template, so /v1/chat/completions works (the lab's privacy canary uses it).
CHAT_TEMPLATE: Final = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant:{% endif %}"
)

_SYLLABLES = (
    "ka ri to na me su lo ve pa ni qu is ten mor al ex ba de fi go hu jo ke li mu no pe ra si tu"
    " vo wa ye zo an en in on un ar er ir or ur st tr pl gr ch sh th"
).split()


def training_corpus(words: int = 60_000, seed: int = 20261122) -> list[str]:
    """Seeded pseudo-words: enough distinct pairs for BPE to reach the full vocabulary, and local."""
    rng = random.Random(seed)
    lines, line = [], []
    for _ in range(words):
        word = "".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 4)))
        line.append(word)
        if len(line) >= 12:
            lines.append(" ".join(line) + rng.choice([".", ",", "?", "!", ""]))
            line = []
    return lines


def build_tokenizer_json() -> str:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=[EOS_TOKEN],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(training_corpus(), trainer=trainer)
    # Every id the random-weight model may sample must decode, so pad up to the model's vocabulary.
    missing = VOCAB_SIZE - tok.get_vocab_size()
    if missing > 0:
        tok.add_special_tokens([f"<|pad_{i}|>" for i in range(missing)])
    if tok.get_vocab_size() != VOCAB_SIZE:
        raise RuntimeError(f"tokenizer has {tok.get_vocab_size()} tokens, expected {VOCAB_SIZE}")
    return str(tok.to_str())


def model_fingerprint() -> str:
    blob = json.dumps({"config": MODEL_CONFIG, "dir_v": 2, "chat": CHAT_TEMPLATE}, sort_keys=True).encode()
    return hashlib.sha256(blob).hexdigest()[:12]


def ensure_model_dir(root: Path) -> Path:
    """Create (once) and return the model directory under `root`; safe to call concurrently-ish."""
    path = root / f"tiny-qwen2-{model_fingerprint()}"
    if (path / ".complete").is_file():
        return path
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(MODEL_CONFIG, indent=2) + "\n")
    (path / "generation_config.json").write_text(
        json.dumps({"bos_token_id": 0, "eos_token_id": 0, "do_sample": False}, indent=2) + "\n"
    )
    (path / "tokenizer.json").write_text(build_tokenizer_json())
    (path / "tokenizer_config.json").write_text(
        json.dumps(
            {
                "tokenizer_class": "PreTrainedTokenizerFast",
                "model_max_length": MODEL_CONFIG["max_position_embeddings"],
                "eos_token": EOS_TOKEN,
                "pad_token": EOS_TOKEN,
                "bos_token": None,
                "add_bos_token": False,
                "clean_up_tokenization_spaces": False,
                "chat_template": CHAT_TEMPLATE,
            },
            indent=2,
        )
        + "\n"
    )
    (path / ".complete").write_text("ok\n")
    return path
