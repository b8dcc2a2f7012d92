"""Random LLaMA-shaped checkpoints for the benchmarks: the real models' widths, random weights.

:func:`write_random_llama` writes one shard by shard (at most one shard in memory);
:func:`generated_weights` is the ``name -> tensor`` source it writes from, deterministic per
(shape, seed, name), so a shape too big for the disk (70b) can be generated in place.
"""

from __future__ import annotations

import json
import math
import shutil
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

from bench.shapes import LLAMA_SHAPES

SHAPES = {k: v for k, v in LLAMA_SHAPES.items() if k != "small"}
INIT_STD = 0.02  # LLaMA's initializer_range


def dtype_of(name: str):
    import torch

    return {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[name]


def tensor_specs(shape: str) -> Iterator[tuple[int | None, str, tuple[int, ...]]]:
    """``(block or None, name, shape)`` of every tensor of a LlamaForCausalLM of this shape, in file order."""
    s = LLAMA_SHAPES[shape]
    d, f, heads, kv = s["hidden_size"], s["intermediate_size"], s["num_attention_heads"], s["num_key_value_heads"]
    hd = d // heads
    yield None, "model.embed_tokens.weight", (s["vocab_size"], d)
    for i in range(s["num_hidden_layers"]):
        p = f"model.layers.{i}."
        yield i, p + "input_layernorm.weight", (d,)
        yield i, p + "self_attn.q_proj.weight", (heads * hd, d)
        yield i, p + "self_attn.k_proj.weight", (kv * hd, d)
        yield i, p + "self_attn.v_proj.weight", (kv * hd, d)
        yield i, p + "self_attn.o_proj.weight", (d, heads * hd)
        yield i, p + "post_attention_layernorm.weight", (d,)
        yield i, p + "mlp.gate_proj.weight", (f, d)
        yield i, p + "mlp.up_proj.weight", (f, d)
        yield i, p + "mlp.down_proj.weight", (d, f)
    yield None, "model.norm.weight", (d,)
    if not s["tie_word_embeddings"]:
        yield None, "lm_head.weight", (s["vocab_size"], d)


def param_count(shape: str) -> int:
    return sum(math.prod(dims) for _, _, dims in tensor_specs(shape))


def generated_weights(shape: str, seed: int = 0, dtype: str = "float32", device: str = "cpu") -> Callable:
    """``name -> tensor``: the random weight of that name, the same for the same (shape, seed, name).

    Each tensor has its own ``torch.Generator`` seeded from (seed, name): norms are ones, every matrix is
    normal(0, 0.02) like a fresh LLaMA init. Values depend on the generator's device (CPU and CUDA
    streams differ). :func:`write_random_llama` writes checkpoints from this. (A shape too big for the
    disk, 70b, is measured by ``bench/gpu_stream.py`` from a pool of random weights in host memory.)
    """
    import torch

    shapes = {name: dims for _, name, dims in tensor_specs(shape)}
    out_dtype = dtype_of(dtype)

    def weight(name: str) -> torch.Tensor:
        dims = shapes[name]
        if len(dims) == 1:
            return torch.ones(dims, dtype=out_dtype, device=device)
        gen = torch.Generator(device=device).manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % 2**63)
        t = torch.empty(dims, dtype=torch.float32, device=device).normal_(0.0, INIT_STD, generator=gen)
        return t.to(out_dtype)

    return weight


def llama_config(shape: str, dtype: str, tokenizer):
    from transformers import LlamaConfig

    return LlamaConfig(
        **LLAMA_SHAPES[shape],
        max_position_embeddings=2048,
        initializer_range=INIT_STD,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        architectures=["LlamaForCausalLM"],
        dtype=dtype,
    )


def write_config_and_tokenizer(path: Path, shape: str, dtype: str) -> None:
    """config.json and the project's tiny word-level tokenizer (its ~70 ids are far below any vocab here)."""
    from core.models.tiny import tiny_tokenizer

    tok = tiny_tokenizer()
    llama_config(shape, dtype, tok).save_pretrained(path)
    tok.save_pretrained(path)


def write_random_llama(
    path: str | Path,
    shape: str,
    dtype: str = "float32",
    seed: int = 0,
    blocks_per_shard: int = 1,
    device: str = "cpu",
    weights: bool = True,
) -> Path:
    """A LlamaForCausalLM directory of random weights, written shard by shard.

    Shards: the embedding, then ``blocks_per_shard`` transformer blocks each, then the final norm (and
    the untied head); plus ``model.safetensors.index.json``, config.json and the tokenizer. At most one
    shard's tensors are in memory at a time. ``weights=False`` writes only config and tokenizer.
    Written into a temporary sibling and renamed into place, so an interrupted run leaves no half checkpoint.
    """
    from safetensors.torch import save_file

    path = Path(path)
    tmp = path.with_name(path.name + ".partial")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    write_config_and_tokenizer(tmp, shape, dtype)
    if weights:
        weight = generated_weights(shape, seed, dtype, device)
        groups: list[list[str]] = []
        current_key: object = object()
        for block, name, _ in tensor_specs(shape):
            key = "head" if block is None and not name.startswith("model.embed") else block
            key = "embed" if name.startswith("model.embed") else key
            key = key // blocks_per_shard if isinstance(key, int) else key
            if key != current_key:
                groups.append([])
                current_key = key
            groups[-1].append(name)
        weight_map, total = {}, 0
        for k, names in enumerate(groups, 1):
            fname = f"model-{k:05d}-of-{len(groups):05d}.safetensors"
            tensors = {n: weight(n).cpu() for n in names}
            save_file(tensors, tmp / fname, metadata={"format": "pt"})
            for n, t in tensors.items():
                weight_map[n] = fname
                total += t.numel() * t.element_size()
            del tensors
        index = {"metadata": {"total_size": total}, "weight_map": weight_map}
        (tmp / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))
    shutil.rmtree(path, ignore_errors=True)
    tmp.rename(path)
    return path


def random_calibration(vocab: int, samples: int, seq_len: int, holdout: int) -> tuple:
    """``samples`` random calibration windows of ``seq_len`` token ids below ``vocab`` and ``holdout``
    held-aside ones (seeded by ``samples``), for a prune that takes its calibration pre-tokenised."""
    import torch

    from core.data.calibration import CalibrationBatch

    gen = torch.Generator().manual_seed(samples)
    ids = torch.randint(0, vocab, (samples, seq_len), generator=gen)
    extra = torch.randint(0, vocab, (holdout, seq_len), generator=gen)
    return CalibrationBatch(ids, torch.ones_like(ids)), CalibrationBatch(extra, torch.ones_like(extra))


def verify_checkpoint(path: str | Path) -> dict:
    """Load with ``AutoModelForCausalLM.from_pretrained`` (all keys present) and check finite logits."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model, info = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, output_loading_info=True)
    tok = AutoTokenizer.from_pretrained(path)
    ids = tok("the model prune a small layer. the data is good.", return_tensors="pt")
    with torch.no_grad():
        logits = model(**ids).logits
    return {
        "class": type(model).__name__,
        "missing_keys": list(info.get("missing_keys", [])),
        "unexpected_keys": list(info.get("unexpected_keys", [])),
        "logits_shape": list(logits.shape),
        "finite": bool(torch.isfinite(logits).all()),
        "max_abs_logit": float(logits.abs().max()),
        "params": sum(p.numel() for p in model.parameters()),
    }
