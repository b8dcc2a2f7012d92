"""LLaMA-shaped model widths the benchmarks build or write (real models' geometry, random weights)."""

from __future__ import annotations

LLAMA_SHAPES: dict[str, dict] = {
    "135m": dict(  # SmolLM2-135M
        hidden_size=576,
        intermediate_size=1536,
        num_hidden_layers=30,
        num_attention_heads=9,
        num_key_value_heads=3,
        vocab_size=49152,
        tie_word_embeddings=True,
    ),
    "1.1b": dict(  # TinyLlama-1.1B
        hidden_size=2048,
        intermediate_size=5632,
        num_hidden_layers=22,
        num_attention_heads=32,
        num_key_value_heads=4,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "7b": dict(
        hidden_size=4096,
        intermediate_size=11008,
        num_hidden_layers=32,
        num_attention_heads=32,
        num_key_value_heads=32,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "13b": dict(
        hidden_size=5120,
        intermediate_size=13824,
        num_hidden_layers=40,
        num_attention_heads=40,
        num_key_value_heads=40,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "30b": dict(  # LLaMA-30B (33B)
        hidden_size=6656,
        intermediate_size=17920,
        num_hidden_layers=60,
        num_attention_heads=52,
        num_key_value_heads=52,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "70b": dict(
        hidden_size=8192,
        intermediate_size=28672,
        num_hidden_layers=80,
        num_attention_heads=64,
        num_key_value_heads=8,
        vocab_size=32000,
        tie_word_embeddings=False,
    ),
    "small": dict(  # a quick smoke shape
        hidden_size=256,
        intermediate_size=688,
        num_hidden_layers=4,
        num_attention_heads=8,
        num_key_value_heads=4,
        vocab_size=1000,
        tie_word_embeddings=False,
    ),
}
