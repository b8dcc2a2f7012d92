"""A pruned checkpoint as one GGUF file that stock llama.cpp runs (and ollama, LM Studio, … with it).

LLaMA, Mistral and Qwen2 go into two GGUF architectures:

- ``llama`` when every layer has the same widths and its kept query heads form equal groups over the
  key/value heads: the file any llama.cpp build reads as a LLaMA model.
- ``deci`` otherwise: llama.cpp's architecture with per-layer arrays of query heads, key/value heads
  and FFN widths (``deci.attention.head_count`` …). Qwen2 always goes this way: llama.cpp's ``qwen2``
  requires the full head count and no bias on the attention output, which pruning changes.

Qwen3, Gemma 2 and Gemma 3 (text) go into their own llama.cpp architecture (``qwen3``, ``gemma2``,
``gemma3``: per-head q/k norms, norms around both sub-layers, soft-capping, sliding windows), which
states one width for all layers and no bias on the attention output or the FFN: a checkpoint with
layers of different widths, or with the biases a reconstruction adds, is refused with the recipe that
gives one it states. Phi-3 goes into ``phi3`` while it keeps every query head and has no added bias,
otherwise into ``llama``/``deci`` (its fused ``qkv_proj``/``gate_up_proj`` split: LLaMA's computation).
Which one is decided by ``core.models.serving_forms.gguf_architecture``, which the check of a recipe
before pruning (``core.serving.preflight``) and the model card use too.

What the conversion does, all of it exact:

- the query and key rows of each head are permuted from transformers' rotate-half layout to the
  pairwise layout of llama.cpp's rotary embedding (its ``llama``/``deci`` models rotate adjacent pairs;
  the families' own architectures rotate halves, as transformers does);
- a layer whose kept query heads form unequal groups (3 heads on one key/value head, 1 on the next)
  gets its key/value heads repeated to the groups' greatest common size, the layout GGUF can state;
- a rotary scaling that divides each frequency by a fixed factor (linear, ``llama3``) goes into the
  ``rope_freqs`` tensor, computed with transformers' own rotary code (linear: the scaling keys in the
  families' own architectures);
- Gemma's norms multiply by 1 + weight, llama.cpp's by the weight: 1 is added; where llama.cpp's
  query scale differs from ``query_pre_attn_scalar ** -0.5`` the ratio goes into the query weights.

Weights are read tensor by tensor (``CheckpointReader``) and written as float16 (matrices) and
float32 (norms, biases); ``f32`` keeps every tensor in float32. The tokenizer goes into the file
(``gguf_vocab``). Anything that cannot be expressed is refused with one sentence before a byte is
written; the file is written beside its target and renamed into place.
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from core.models.config_file import read_config
from core.models.liar_families import FAMILIES
from core.models.safetensors_io import CheckpointError, CheckpointReader
from core.models.serving_forms import SERVED_FAMILIES, SHARED, Form, checkpoint_form, gguf_architecture
from core.serving.card import list_forms, verify_checkpoint
from core.serving.gguf_vocab import Vocab, VocabError, read_vocab, write_vocab
from core.serving.layout import (
    ExportError,
    LayerShape,
    Tensors,
    check_rope,
    gguf_family,
    head_rows,
    layers_of,
    rope,
)
from core.spec.recipe import GGUF_TYPES

DTYPES = ("f16", "f32")
GEMMA = ("gemma2", "gemma3")
_ACTIVATION = {"qwen3": "silu", "phi3": "silu", "gemma2": "gelu_pytorch_tanh", "gemma3": "gelu_pytorch_tanh"}
_LARGE = {"gemma2": 46, "gemma3": 62}  # block counts llama.cpp takes for the 27B models (its attention scale)


@dataclass(frozen=True)
class GgufPlan:
    arch: str  # "llama", "deci", or the family's own: "qwen3", "gemma2", "gemma3", "phi3"
    family: str
    layers: list[LayerShape]
    head_dim: int
    config: dict
    extras: dict = field(default_factory=dict)  # own architectures: rotary, sliding windows, caps, query scale
    form: Form | None = None  # what decided ``arch`` (``core.models.serving_forms``)
    n_rot: int = 0  # channels of a head rotated


def _refuse(family: str, what: str, fix: str) -> ExportError:
    return ExportError(f"llama.cpp's {family} architecture {what}: {fix}")


def _rotary(hf, family: str, n_layers: int, head_dim: int) -> dict:
    """The rotary settings of a family written in its own architecture (default or linear scaling; Gemma 3's
    sliding-window layers their own base, unscaled); ``ExportError`` for anything else."""
    params = dict(hf.rope_parameters or {})
    full = params.get("full_attention", params)
    local = params.get("sliding_attention", full)
    kind, local_kind = full.get("rope_type", "default"), local.get("rope_type", "default")
    if kind not in ("default", "linear") or (local is not full and local_kind != "default"):
        what = "states plain or linearly scaled rotary embeddings (plain ones in sliding-window layers)"
        raise _refuse(family, what, f"this checkpoint's are {kind!r} (sliding-window layers {local_kind!r})")
    n_rot = int(head_dim * float(full.get("partial_rotary_factor", 1.0)))
    if family != "phi3" and n_rot != head_dim:
        raise _refuse(family, "rotates every channel of a head", f"this checkpoint rotates {n_rot} of {head_dim}")
    types = list(getattr(hf, "layer_types", None) or ["full_attention"] * n_layers)
    swa = [t == "sliding_attention" for t in types]
    if any(swa) and family not in GEMMA or set(types) - {"sliding_attention", "full_attention"}:
        raise _refuse(family, "has no such attention layers", f"this checkpoint's are {sorted(set(types))}")
    factor = float(full.get("factor", 1.0)) if full.get("rope_type") == "linear" else None
    return {"theta": float(full["rope_theta"]), "theta_swa": float(local["rope_theta"]), "factor": factor,
            "n_rot": n_rot, "swa": swa, "window": int(getattr(hf, "sliding_window", None) or 0)}  # fmt: skip


def _own_settings(config: dict, family: str, layers: list[LayerShape], head_dim: int) -> dict:
    """What a family's own llama.cpp architecture states beyond the LLaMA keys; ``ExportError`` when the
    checkpoint differs from what that architecture computes."""
    import transformers

    hf = getattr(transformers, FAMILIES[family].config_class)(**config)
    act = getattr(hf, "hidden_activation", None) or hf.hidden_act
    if act != _ACTIVATION[family]:
        raise _refuse(family, f"computes its FFN with {_ACTIVATION[family]}", f"this checkpoint's is {act}")
    extras = _rotary(hf, family, len(layers), head_dim)
    if family not in GEMMA:
        return extras
    attn_cap, final_cap = getattr(hf, "attn_logit_softcapping", None), getattr(hf, "final_logit_softcapping", None)
    if family == "gemma2" and not (attn_cap and final_cap and hf.tie_word_embeddings):
        raise _refuse(family, "soft-caps attention scores and logits and reads its output from the token "
                      "embedding", "this checkpoint does not (attn_logit_softcapping, final_logit_softcapping, "
                      "tie_word_embeddings)")  # fmt: skip
    if family == "gemma3" and attn_cap:
        raise _refuse(family, "does not soft-cap attention scores", "this checkpoint sets attn_logit_softcapping")
    # llama.cpp scales queries by 1/sqrt(head size), or 1/sqrt(hidden size / heads) for its 27B models;
    # transformers by query_pre_attn_scalar ** -0.5: the ratio goes into the query weights
    n_head = layers[0].n_head
    theirs = hf.hidden_size // n_head if len(layers) == _LARGE[family] else head_dim
    q_scale = math.sqrt(theirs / float(hf.query_pre_attn_scalar))
    return {**extras, "attn_cap": attn_cap, "final_cap": final_cap, "q_scale": q_scale}


def plan(directory: str | Path) -> GgufPlan:
    """How the checkpoint in ``directory`` becomes GGUF; ``ExportError`` when it cannot."""
    config = read_config(directory)
    family = gguf_family(config)
    layers, head_dim = layers_of(config)
    form = checkpoint_form(config, layers, head_dim)
    extras = {} if family in SERVED_FAMILIES else _own_settings(config, family, layers, head_dim)
    n_rot = extras.get("n_rot", head_dim)
    arch = gguf_architecture(family, form, n_rot, head_dim)
    if arch in SHARED:  # LLaMA's computation: a pruned Phi-3 too, its own settings unused
        check_rope(config)
        extras = {}
    return GgufPlan(arch, family, layers, head_dim, config, extras, form=form, n_rot=n_rot)


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


class Unfused(Tensors):
    """Phi-3's fused projections under LLaMA's names: ``q_proj``/``k_proj``/``v_proj`` the row blocks of
    ``qkv_proj`` (``n_q[i]`` query rows in layer ``i``, then key and value rows alike), ``gate_proj`` and
    ``up_proj`` the halves of ``gate_up_proj``."""

    _PARTS = {"q_proj": ("self_attn.qkv_proj", 0), "k_proj": ("self_attn.qkv_proj", 1),
              "v_proj": ("self_attn.qkv_proj", 2), "gate_proj": ("mlp.gate_up_proj", 0),
              "up_proj": ("mlp.gate_up_proj", 1)}  # fmt: skip

    def __init__(self, reader: CheckpointReader, meta: bool, n_q: list[int]):
        super().__init__(reader, meta)
        self.n_q = n_q

    def _fused(self, name: str) -> tuple[str, int, int] | None:
        parts = name.split(".")  # model.layers.I.(self_attn|mlp).PROJ.KIND
        if len(parts) != 6 or parts[4] not in self._PARTS:
            return None
        module, part = self._PARTS[parts[4]]
        return f"model.layers.{parts[2]}.{module}.{parts[5]}", part, int(parts[2])

    def has(self, name: str) -> bool:
        fused = self._fused(name)
        return super().has(fused[0] if fused else name)

    def get(self, name: str) -> torch.Tensor:
        fused = self._fused(name)
        if fused is None:
            return super().get(name)
        t = super().get(fused[0])
        if fused[0].endswith("gate_up_proj." + name.rsplit(".", 1)[1]):
            return t.chunk(2, dim=0)[fused[1]]
        n_q = self.n_q[fused[2]]
        n_kv = (t.shape[0] - n_q) // 2
        return t.split([n_q, n_kv, n_kv], dim=0)[fused[1]]


def _source(reader: CheckpointReader, meta: bool, p: GgufPlan) -> Tensors:
    if p.family == "phi3":
        return Unfused(reader, meta, [x.n_head * p.head_dim for x in p.layers])
    return Tensors(reader, meta)


def _norm(t: torch.Tensor, p: GgufPlan) -> torch.Tensor:
    """Gemma's RMSNorm multiplies by 1 + weight, llama.cpp's by the weight."""
    return t + 1.0 if p.family in GEMMA else t


_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm"}
_GEMMA_NORMS = {"input_layernorm": "attn_norm", "post_attention_layernorm": "post_attention_norm",
                "pre_feedforward_layernorm": "ffn_norm", "post_feedforward_layernorm": "post_ffw_norm"}  # fmt: skip


def _attention_in(src: Tensors, p: GgufPlan, i: int):
    """(GGUF name, tensor) of block ``i``'s query, key and value projections and their norms."""
    x, hd, pre, out = p.layers[i], p.head_dim, f"model.layers.{i}.", f"blk.{i}."
    q_scale = p.extras.get("q_scale", 1.0)
    fused: dict[str, list[torch.Tensor]] = {}
    for proj, heads, n in (("q", x.q_heads, x.n_head), ("k", x.kv_rows, x.n_kv), ("v", x.kv_rows, x.n_kv)):
        for kind in ("weight", "bias"):
            name = f"{pre}self_attn.{proj}_proj.{kind}"
            if src.has(name):
                t = head_rows(src.get(name), heads, hd)
                t = _pairwise(t, n) if p.arch in SHARED and proj != "v" else t
                t = t * q_scale if proj == "q" and p.arch == "gemma2" and q_scale != 1.0 else t
                fused.setdefault(kind, []).append(t)
                if p.arch != "phi3":
                    yield f"{out}attn_{proj}.{kind}", t
    if p.arch == "phi3":
        yield from ((f"{out}attn_qkv.{kind}", torch.cat(parts)) for kind, parts in fused.items())
    for proj in ("q", "k"):
        if src.has(f"{pre}self_attn.{proj}_norm.weight"):
            t = _norm(src.get(f"{pre}self_attn.{proj}_norm.weight"), p)
            yield f"{out}attn_{proj}_norm.weight", t * q_scale if proj == "q" and q_scale != 1.0 else t


def _layer_tensors(src: Tensors, p: GgufPlan, i: int):
    """(GGUF name, tensor) of block ``i``."""
    x, hd, pre, out = p.layers[i], p.head_dim, f"model.layers.{i}.", f"blk.{i}."
    for name, gguf_name in (_GEMMA_NORMS if p.family in GEMMA else _NORMS).items():
        yield f"{out}{gguf_name}.weight", _norm(src.get(f"{pre}{name}.weight"), p)
    yield from _attention_in(src, p, i)
    o = src.get(pre + "self_attn.o_proj.weight")
    yield out + "attn_output.weight", head_rows(o.T, x.q_heads, hd).T
    if src.has(pre + "self_attn.o_proj.bias"):
        yield out + "attn_output.bias", src.get(pre + "self_attn.o_proj.bias")
    if p.arch == "phi3":  # llama.cpp's phi3 reads gate and up as one matrix, gate first
        yield out + "ffn_up.weight", torch.cat([src.get(f"{pre}mlp.{proj}_proj.weight") for proj in ("gate", "up")])
    for proj in ("down",) if p.arch == "phi3" else ("gate", "up", "down"):
        for kind in ("weight", "bias"):
            name = f"{pre}mlp.{proj}_proj.{kind}"
            if src.has(name):
                yield f"{out}ffn_{proj}.{kind}", src.get(name)


def _all_tensors(src: Tensors, p: GgufPlan, factors: np.ndarray | None):
    yield "token_embd.weight", src.get("model.embed_tokens.weight")
    for i in range(len(p.layers)):
        yield from _layer_tensors(src, p, i)
    yield "output_norm.weight", _norm(src.get("model.norm.weight"), p)
    # llama.cpp's gemma2 reads its output projection from the token embedding (a tied one: plan checks)
    if src.has("lm_head.weight") and not p.config.get("tie_word_embeddings", False) and p.arch != "gemma2":
        yield "output.weight", src.get("lm_head.weight")
    if factors is not None:
        yield "rope_freqs.weight", torch.from_numpy(factors).to("meta" if src.meta else "cpu")


def tensors(reader, p: GgufPlan, meta: bool = False):
    """(GGUF name, tensor) of every tensor the file holds but the rotary factors, read from ``reader``
    (a ``CheckpointReader``, or an object that reads like one) through the conversion (``meta``:
    shapes only)."""
    return _all_tensors(_source(reader, meta, p), p, None)


def _own_metadata(writer, p: GgufPlan) -> None:
    """The keys of a family's own architecture beyond LLaMA's."""
    import gguf

    e = p.extras
    if e["factor"] is not None:
        writer.add_rope_scaling_type(gguf.RopeScalingType.LINEAR)
        writer.add_rope_scaling_factor(e["factor"])
    if p.arch not in GEMMA:
        return
    if any(e["swa"]) or p.arch == "gemma2":
        writer.add_sliding_window(e["window"])
        writer.add_sliding_window_pattern(e["swa"])
        writer.add_rope_freq_base_swa(e["theta_swa"])
    if e["attn_cap"]:
        writer.add_attn_logit_softcapping(float(e["attn_cap"]))
    if e["final_cap"]:
        writer.add_final_logit_softcapping(float(e["final_cap"]))


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
    writer.add_rope_dimension_count(p.extras.get("n_rot", p.head_dim))
    writer.add_rope_freq_base(float(p.extras["theta"] if p.extras else rope(c)["rope_theta"]))
    writer.add_layer_norm_rms_eps(float(c.get("rms_norm_eps", 1e-6)))
    writer.add_vocab_size(c["vocab_size"])
    if p.extras:
        _own_metadata(writer, p)


_PHI3_NAME = re.compile("phi-?3", re.IGNORECASE)


def _model_name(name: str, vocab: Vocab) -> str:
    """The file's ``general.name``, the checkpoint folder's. llama.cpp sets Phi-3's whitespace handling on
    the tokens ``<s>``, ``</s>``, ``<unk>``, ``<|endoftext|>`` of a model whose name holds "phi3" or "phi-3",
    and fails to load one whose vocabulary lacks any: such a name loses the "3"."""
    if _PHI3_NAME.search(name) and not {"<s>", "</s>", "<unk>", "<|endoftext|>"} <= set(vocab.tokens):
        return _PHI3_NAME.sub("phi", name)
    return name


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
    factors = _rope_factors(p.config, p.family, p.head_dim) if p.arch in SHARED else None
    if not out.parent.is_dir():
        raise ExportError(f"the folder of the output {str(out)!r} does not exist")
    matrix = np.dtype(np.float16 if dtype == "f16" else np.float32)
    as_type = lambda t: matrix if t.dim() > 1 else np.dtype(np.float32)  # noqa: E731  norms, biases: float32
    tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
    file_type = gguf.LlamaFileType.MOSTLY_F16 if dtype == "f16" else gguf.LlamaFileType.ALL_F32
    writer = gguf.GGUFWriter(tmp, p.arch)
    try:
        _metadata(writer, p, _model_name(ready.directory.name, ready.vocab), int(file_type))
        write_vocab(writer, ready.vocab)
        for name, t in _all_tensors(_source(reader, True, p), p, factors):
            writer.add_tensor_info(name, tuple(t.shape), as_type(t), t.numel() * as_type(t).itemsize)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for _, t in _all_tensors(_source(reader, False, p), p, factors):
            writer.write_tensor_data(np.ascontiguousarray(t.numpy().astype(as_type(t))))
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return out


QUANTS = GGUF_TYPES
QUANTIZED = GGUF_TYPES[2:]  # written by llama.cpp's quantizer from the f16 file


def default_name(directory: str | Path, quant: str) -> str:
    return f"{Path(directory).expanduser().resolve().name}-{quant}.gguf"


def export_gguf(
    directory: str | Path,
    out: str | Path | None = None,
    quant: str = "f16",
    threads: int = 2,
    verify: bool = True,
    imatrix: str | Path | None = None,
) -> Path:
    """The checkpoint in ``directory`` as one GGUF file at ``out`` (default: inside the checkpoint,
    ``<name>-<quant>.gguf``, added to its ``SHA256SUMS``). ``quant`` f32 / f16 are written here; the
    others (``QUANTIZED``) are the f16 file quantized by llama.cpp's own quantizer (``liar engines
    install``), weighted by the importance matrix file ``imatrix`` when given (llama.cpp's form;
    ``core.serving.quantize.resolve_imatrix`` makes one from the checkpoint's calibration text).
    Every check runs before a byte is written; a failure leaves nothing behind."""
    from core.serving.engines import INSTALL_HINT, call_llama_cpp, llama_cpp_python
    from core.serving.imatrix import IMATRIX_HINT, NEEDS_IMATRIX, check_fits, read

    if quant not in QUANTS:
        raise ExportError(f"GGUF type {quant!r} is not one of {', '.join(QUANTS)}")
    directory = Path(directory).expanduser()
    if not (directory / "config.json").is_file():
        raise ExportError(f"{str(directory)!r} is not a checkpoint folder (no config.json)")
    if quant in NEEDS_IMATRIX and imatrix is None:
        raise ExportError(f"{quant} needs an importance matrix: {IMATRIX_HINT}")
    if imatrix is not None and quant not in QUANTIZED:
        raise ExportError(f"an importance matrix weights llama.cpp's quantizer, which {quant} does not use")
    if imatrix is not None and not Path(imatrix).expanduser().is_file():
        raise ExportError(f"the importance matrix {str(imatrix)!r} is not a file")
    inside = out is None
    out = directory / default_name(directory, quant) if inside else Path(out).expanduser()
    if quant in QUANTIZED and llama_cpp_python() is None:
        raise ExportError(f"{quant} needs llama.cpp's quantizer, which is not installed: {INSTALL_HINT}")
    ready = check_exportable(directory)
    if verify:
        verify_checkpoint(directory)
    if imatrix is not None:
        columns = {n: int(t.shape[1]) for n, t in tensors(ready.reader, ready.plan, meta=True) if t.dim() == 2}
        check_fits(read(imatrix), columns, Path(imatrix).name)
    if quant in ("f32", "f16"):
        write_gguf(ready, out, dtype=quant)
    else:
        f16 = out.with_name(f".{out.name}.f16-{os.getpid()}")
        tmp = out.with_name(f".{out.name}.tmp-{os.getpid()}")
        request = {"op": "quantize", "src": str(f16), "dst": str(tmp), "type": quant, "threads": threads}
        request["imatrix"] = str(Path(imatrix).expanduser()) if imatrix is not None else None
        try:
            write_gguf(ready, f16, dtype="f16")
            call_llama_cpp(request)
            os.replace(tmp, out)
        finally:
            f16.unlink(missing_ok=True)
            tmp.unlink(missing_ok=True)
    if inside:
        list_forms(directory)
    return out
