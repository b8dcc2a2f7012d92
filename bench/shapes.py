"""LLaMA-shaped model widths the benchmarks build or write (real models' geometry, random weights)."""

from __future__ import annotations

FIELDS = (
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "vocab_size",
    "tie_word_embeddings",
)
# one row a shape, in FIELDS' order
_ROWS = {
    "135m": (576, 1536, 30, 9, 3, 49152, True),  # SmolLM2-135M
    "1.1b": (2048, 5632, 22, 32, 4, 32000, False),  # TinyLlama-1.1B
    "7b": (4096, 11008, 32, 32, 32, 32000, False),
    "13b": (5120, 13824, 40, 40, 40, 32000, False),
    "30b": (6656, 17920, 60, 52, 52, 32000, False),  # LLaMA-30B (33B)
    "70b": (8192, 28672, 80, 64, 8, 32000, False),
    "small": (256, 688, 4, 8, 4, 1000, False),  # a quick smoke shape
}
LLAMA_SHAPES: dict[str, dict] = {name: dict(zip(FIELDS, row, strict=True)) for name, row in _ROWS.items()}
