"""A pruned checkpoint as one GGUF file that stock llama.cpp runs (and ollama, LM Studio, … with it).

Two GGUF architectures cover the LLaMA, Mistral and Qwen2 families:

- ``llama`` when every layer has the same widths and its kept query heads form equal groups over the
  key/value heads: the file any llama.cpp build reads as a LLaMA model.
- ``deci`` otherwise: llama.cpp's architecture with per-layer arrays of query heads, key/value heads
  and FFN widths (``deci.attention.head_count`` …). Qwen2 always goes this way: llama.cpp's ``qwen2``
  requires the full head count and no bias on the attention output, which pruning changes.

What the conversion does, all of it exact:

- the query and key rows of each head are permuted from transformers' rotate-half layout to the
  pairwise layout of llama.cpp's rotary embedding (its ``llama``/``deci`` models rotate adjacent pairs);
- a layer whose kept query heads form unequal groups (3 heads on one key/value head, 1 on the next)
  gets its key/value heads repeated to the groups' greatest common size, the layout GGUF can state;
- a rotary scaling that divides each frequency by a fixed factor (linear, ``llama3``) goes into the
  ``rope_freqs`` tensor, computed with transformers' own rotary code.

Weights are read tensor by tensor (``CheckpointReader``) and written as float16 (matrices) and
float32 (norms, biases); ``f32`` keeps every tensor in float32. The tokenizer goes into the file
(``gguf_vocab``). Anything that cannot be expressed is refused with one sentence before a byte is
written; the file is written beside its target and renamed into place.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from core.models.config_file import read_config
from core.models.liar_families import FAMILIES
from core.models.manifest import MANIFEST, file_sha256, read_manifest
from core.models.safetensors_io import CheckpointError, CheckpointReader
from core.serving.card import list_forms
from core.serving.gguf_vocab import Vocab, VocabError, read_vocab, write_vocab
from core.serving.layout import (
    ExportError,
    LayerShape,
    Tensors,
    check_rope,
    head_rows,
    layers_of,
    rope,
    served_family,
)

DTYPES = ("f16", "f32")


@dataclass(frozen=True)
class GgufPlan:
    arch: str  # "llama" or "deci"
    family: str
    layers: list[LayerShape]
    head_dim: int
    config: dict


def plan(directory: str | Path) -> GgufPlan:
    """How the checkpoint in ``directory`` becomes GGUF; ``ExportError`` when it cannot."""
    config = read_config(directory)
    family = served_family(config)
    layers, head_dim = layers_of(config)
    check_rope(config)
    first = layers[0]
    uniform = all((x.n_head, x.n_kv, x.n_ff) == (first.n_head, first.n_kv, first.n_ff) for x in layers)
    regrouped = any(x.q_heads != sorted(x.q_heads) or len(set(x.kv_rows)) != x.n_kv for x in layers)
    arch = "llama" if family != "qwen2" and uniform and not regrouped else "deci"
    return GgufPlan(arch=arch, family=family, layers=layers, head_dim=head_dim, config=config)


def _rope_factors(config: dict, family: str, head_dim: int) -> np.ndarray | None:
    """Per-frequency divisors of a scaled rotary embedding (None for plain rotary), from transformers'
    own rotary initialisation: the plain frequencies over the scaled ones."""
    settings = rope(config)
    if settings["rope_type"] == "default":
        return None
    import transformers
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    cfg = getattr(transformers, FAMILIES[family].config_class)(**config)
    scaled, attention_factor = ROPE_INIT_FUNCTIONS[settings["rope_type"]](cfg, "cpu")
    if abs(float(attention_factor) - 1.0) > 1e-6:
        raise ExportError(f"rotary scaling {settings['rope_type']!r} scales attention; GGUF export cannot state it")
    plain = 1.0 / (settings["rope_theta"] ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
    return (plain / scaled.double()).float().numpy()


def _pairwise(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """Rows of ``n_heads`` heads from rotate-half order (first halves, then second halves) to
    adjacent pairs, the order llama.cpp's ``llama``/``deci`` rotary embedding expects."""
    shape = w.shape
    half = shape[0] // n_heads // 2
    return w.reshape(n_heads, 2, half, *shape[1:]).transpose(1, 2).reshape(shape)


def _layer_tensors(src: Tensors, p: GgufPlan, i: int):
    """(GGUF name, tensor) of block ``i``."""
    x, hd, pre, out = p.layers[i], p.head_dim, f"model.layers.{i}.", f"blk.{i}."
    yield out + "attn_norm.weight", src.get(pre + "input_layernorm.weight")
    yield out + "ffn_norm.weight", src.get(pre + "post_attention_layernorm.weight")
    for proj, heads, n in (("q", x.q_heads, x.n_head), ("k", x.kv_rows, x.n_kv), ("v", x.kv_rows, x.n_kv)):
        for kind in ("weight", "bias"):
            name = f"{pre}self_attn.{proj}_proj.{kind}"
            if src.has(name):
                t = head_rows(src.get(name), heads, hd)
                yield f"{out}attn_{proj}.{kind}", t if proj == "v" else _pairwise(t, n)
    o = src.get(pre + "self_attn.o_proj.weight")
    yield out + "attn_output.weight", head_rows(o.T, x.q_heads, hd).T
    if src.has(pre + "self_attn.o_proj.bias"):
        yield out + "attn_output.bias", src.get(pre + "self_attn.o_proj.bias")
    for proj in ("gate", "up", "down"):
        for kind in ("weight", "bias"):
            name = f"{pre}mlp.{proj}_proj.{kind}"
            if src.has(name):
                yield f"{out}ffn_{proj}.{kind}", src.get(name)


def _all_tensors(src: Tensors, p: GgufPlan, factors: np.ndarray | None):
    yield "token_embd.weight", src.get("model.embed_tokens.weight")
    for i in range(len(p.layers)):
        yield from _layer_tensors(src, p, i)
    yield "output_norm.weight", src.get("model.norm.weight")
    if src.has("lm_head.weight") and not p.config.get("tie_word_embeddings", False):
        yield "output.weight", src.get("lm_head.weight")
    if factors is not None:
        yield "rope_freqs.weight", torch.from_numpy(factors).to("meta" if src.meta else "cpu")


def _metadata(writer, p: GgufPlan, name: str, file_type: int) -> None:
    c, arch = p.config, p.arch
    per_layer = arch == "deci"
    pick = (lambda values: values) if per_layer else (lambda values: values[0])  # noqa: E731
    writer.add_name(name)
    writer.add_file_type(file_type)
    writer.add_context_length(c.get("max_position_embeddings", 4096))
    writer.add_embedding_length(c["hidden_size"])
    writer.add_block_count(len(p.layers))
    writer.add_feed_forward_length(pick([x.n_ff for x in p.layers]))
    writer.add_head_count(pick([x.n_head for x in p.layers]))
    writer.add_head_count_kv(pick([x.n_kv for x in p.layers]))
    writer.add_key_length(p.head_dim)
    writer.add_value_length(p.head_dim)
    writer.add_rope_dimension_count(p.head_dim)
    writer.add_rope_freq_base(float(rope(c)["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(c["vocab_size"])


@dataclass(frozen=True)
class Prepared:
    """A checkpoint checked for GGUF: its plan, its weight files' reader and its vocabulary."""

    directory: Path
    plan: GgufPlan
    reader: CheckpointReader
    vocab: Vocab


def check_exportable(directory: str | Path) -> Prepared:
    """Everything but the digests: the family, the rotary scaling, the weight files' headers and the
    tokenizer (``ExportError`` naming the first problem)."""
    directory = Path(directory).expanduser()
    p = plan(directory)
    try:
        reader = CheckpointReader(directory)
    except CheckpointError as exc:
        raise ExportError(str(exc)) from None
    missing = [n for n in ("model.embed_tokens.weight", "model.norm.weight") if n not in reader]
    if missing:
        raise ExportError(f"{directory} has no tensor {missing[0]!r}: not a {p.family} checkpoint's weights")
    try:
        vocab = read_vocab(directory, reader.entries["model.embed_tokens.weight"].shape[0])
    except VocabError as exc:
        raise ExportError(f"cannot write the tokenizer into the GGUF: {exc}") from None
    return Prepared(directory, p, reader, vocab)


def write_gguf(checkpoint: str | Path | Prepared, out: str | Path, dtype: str = "f16") -> Path:
    """Write the checkpoint (a folder, or one :func:`check_exportable` prepared) as the GGUF file ``out``
    (``dtype`` f16 or f32)."""
    import gguf

    if dtype not in DTYPES:
        raise ExportError(f"GGUF precision {dtype!r} is not one of {', '.join(DTYPES)}")
    ready = checkpoint if isinstance(checkpoint, Prepared) else check_exportable(checkpoint)
    p, reader, out = ready.plan, ready.reader, Path(out).expanduser()
    factors = _rope_factors(p.config, p.family, p.head_dim)
    if not out.parent.is_dir():
        raise ExportError(f"the folder of the output {str(out)!r} does not exist")
    matrix = np.dtype(np.float16 if dtype == "f16" else np.float32)
    as_type = lambda t: matrix if t.dim() > 1 else np.dtype(np.float32)  # noqa: E731  norms, biases: float32
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    file_type = gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
    writer = gguf.GGUFWriter(tmp, p.arch)
    try:
        _metadata(writer, p, ready.directory.name, int(file_type))
        write_vocab(writer, ready.vocab)
        for name, t in _all_tensors(Tensors(reader, meta=True), p, factors):
            writer.add_tensor_info(name, tuple(t.shape), as_type(t), t.numel() * as_type(t).itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, t in _all_tensors(Tensors(reader, meta=False), p, factors):
            writer.write_tensor_data(np.ascontiguousarray(t.numpy().astype(as_type(t))))
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return out


QUANTS = ("f32", "f16", "q8_0", "q4_k_m")


def default_name(directory: str | Path, quant: str) -> str:
    return f"{Path(directory).expanduser().resolve().name}-{quant}.gguf"


_HASHED: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) → sha256, of the weight files hashed


def _digest(path: Path) -> str:
    """The file's sha256, hashed once per process while its size and modification time stay the same
    (a job writing several forms checks the same checkpoint before each)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = file_sha256(path)
    return _HASHED[key]


def verify_checkpoint(directory: Path) -> None:
    """Check the weight files against the checkpoint's ``SHA256SUMS`` (when it has one): a corrupt file
    is named before anything is written."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return
    try:
        entries = read_manifest(directory)
    except (FileNotFoundError, ValueError) as exc:
        raise ExportError(f"the checkpoint is incomplete: {exc}") from None
    for e in entries:
        if e.name.endswith(".safetensors") and _digest(directory / e.name) != e.sha256:
            raise ExportError(f"{directory / e.name} does not match its digest in {MANIFEST}: the file is corrupt")


def export_gguf(
    directory: str | Path, out: str | Path | None = None, quant: str = "f16", threads: int = 2, verify: bool = True
) -> Path:
    """The checkpoint in ``directory`` as one GGUF file at ``out`` (default: inside the checkpoint,
    ``<name>-<quant>.gguf``, added to its ``SHA256SUMS``). ``quant`` f32 / f16 are written here;
    q8_0 / q4_k_m are the f16 file quantized by llama.cpp's own quantizer (``liar engines install``).
    Every check runs before a byte is written; a failure leaves nothing behind."""
    from core.serving.engines import INSTALL_HINT, call_llama_cpp, llama_cpp_python

    if quant not in QUANTS:
        raise ExportError(f"GGUF type {quant!r} is not one of {', '.join(QUANTS)}")
    directory = Path(directory).expanduser()
    if not (directory / "config.json").is_file():
        raise ExportError(f"{str(directory)!r} is not a checkpoint folder (no config.json)")
    inside = out is None
    out = directory / default_name(directory, quant) if inside else Path(out).expanduser()
    if quant in ("q8_0", "q4_k_m") and llama_cpp_python() is None:
        raise ExportError(f"{quant} needs llama.cpp's quantizer, which is not installed: {INSTALL_HINT}")
    ready = check_exportable(directory)
    if verify:
        verify_checkpoint(directory)
    if quant in ("f32", "f16"):
        write_gguf(ready, out, dtype=quant)
    else:
        f16 = out.with_name(f".{out.name}.f16-{os.getpid()}")
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        try:
            write_gguf(ready, f16, dtype="f16")
            call_llama_cpp({"op": "quantize", "src": str(f16), "dst": str(tmp), "type": quant, "threads": threads})
            os.replace(tmp, out)
        finally:
            f16.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
    if inside:
        list_forms(directory)
    return out
