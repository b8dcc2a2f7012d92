"""What a pruning run costs, counted from the model's shapes and the recipe (no weights, no torch):
the parameters in and outside the blocks, the floating-point work of each pass by the precision it
runs in, and the bytes a run holds at its peak. :mod:`core.pipeline.estimate` turns these into a
worker class's time and memory; ``tests/core/pipeline/test_estimate.py`` checks them against real
prunes, the engine's own sizing and counted products.

Work is in FLOPs (two per multiply-add), in three kinds: ``dense`` — model-dtype products (block
passes, Gram products); ``fp64`` — float64 factorisations, solves and OBS paths; ``report`` — the
per-layer error report (TF32 products with the Gram on a GPU when nothing is held aside).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from core.models.liar_families import Family, family_of, pools_first_token
from core.pipeline.preflight import width_ratio
from core.spec.criteria import WHOLE_MODEL_GRADIENTS
from core.spec.recipe import Recipe

# criteria that run the dense model's blocks on the calibration data to score (core/criteria: needs "inputs")
INPUT_CRITERIA = ("flap", "kcm", "obs")
# float64 C × C matrices a block's statistics and solves hold (core/models/offload.py, tested against it)
REFIT_MATRICES, OBS_MATRICES = 17 / 8, 3.0


@dataclass(frozen=True)
class Shape:
    """A model's geometry as the engine prunes it (a block's widths, parameters in and outside blocks)."""

    family: Family
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    vocab: int
    block_params: int  # one block's
    outer_params: int  # everything outside the blocks
    ffn_in: int  # matrices reading the hidden state into the FFN (2 for gated FFNs)
    dtype: str | None  # the checkpoint's stored floating dtype, as its config says
    out_biases: tuple[bool, bool] = (False, False)  # whether o_proj and the FFN's output projection have a bias
    pools_first: bool = False  # a sequence classifier reading the first token (what criterion auto resolves by)

    @property
    def params(self) -> int:
        return self.layers * self.block_params + self.outer_params


_TIED_DEFAULT = ("gemma2", "gemma3", "opt", "bert")  # config classes whose tie_word_embeddings defaults to True
_HEAD_DIM_DEFAULT = {"qwen3": 128, "gemma2": 256, "gemma3": 256}  # config classes with their own head_dim default


def shape_of(config: dict[str, Any]) -> Shape:
    """The :class:`Shape` of a raw ``config.json``; ``ValueError`` for an unsupported model type.
    Defaults are those of the family's transformers config class (what loading the file gives)."""
    c, fam = config, family_of(config.get("model_type"))
    if fam is None:
        raise ValueError(f"model type {config.get('model_type')!r} is not supported")
    d, h, f = int(c["hidden_size"]), int(c["num_attention_heads"]), int(c[fam.ffn_width_key])
    kv = int(c.get("num_key_value_heads") or h) if fam.gqa else h
    hd = int(c.get("head_dim") or _HEAD_DIM_DEFAULT.get(fam.name, d // h)) if fam.head_dim_in_config else d // h
    q, k = h * hd, kv * hd
    bias = bool(c.get("attention_bias", fam.name == "qwen2")) or fam.name in ("opt", "bert")
    attn = d * (q + 2 * k) + q * d + (q + 2 * k) * bias + d * (bias and fam.name != "qwen2")
    attn += 2 * hd * (fam.name in ("qwen3", "gemma3"))  # per-head q/k norms
    ffn_in = 1 if fam.name in ("opt", "bert") else 2
    mlp_bias = fam.name in ("opt", "bert") or bool(c.get("mlp_bias"))
    mlp = (ffn_in + 1) * d * f + (ffn_in * f + d) * mlp_bias
    norms = {"opt": 4 * d, "bert": 4 * d, "gemma2": 4 * d, "gemma3": 4 * d}.get(fam.name, 2 * d)
    vocab = int(c["vocab_size"])
    tied = bool(c.get("tie_word_embeddings", fam.name in _TIED_DEFAULT))
    dtype = c.get("dtype") or c.get("torch_dtype")
    return Shape(
        fam, int(c["num_hidden_layers"]), d, h, kv, hd, f, vocab, attn + mlp + norms, _outer(c, fam, d, tied),
        ffn_in, dtype if isinstance(dtype, str) else None, (bias and fam.name != "qwen2", mlp_bias),
        pools_first_token(c.get("architectures")),
    )  # fmt: skip


def _outer(c: dict[str, Any], fam: Family, d: int, tied: bool) -> int:
    """Parameters outside the blocks: embeddings, final norm, output or task head."""
    v = int(c["vocab_size"])
    if fam.name == "bert":
        arch = " ".join(c.get("architectures") or [])
        labels = len(c.get("id2label") or {}) or int(c.get("num_labels", 2))
        emb = (v + int(c["max_position_embeddings"]) + int(c.get("type_vocab_size", 2)) + 2) * d
        pooler = 0 if "QuestionAnswering" in arch else d * d + d
        head = (d + 1) * labels if "SequenceClassification" in arch else (d + 1) * 2 if pooler == 0 else 0
        return emb + pooler + head
    if fam.name == "opt":
        e = int(c.get("word_embed_proj_dim") or d)
        final = 2 * d if c.get("do_layer_norm_before", True) and not c.get("_remove_final_layer_norm") else 0
        project = 2 * d * e if e != d else 0
        return v * e + (int(c["max_position_embeddings"]) + 2) * d + final + project + (0 if tied else v * e)
    return v * d + d + (0 if tied else v * d)


@dataclass(frozen=True)
class Run:
    """What a width prune does per block, as the work and memory counts read it (the cuts are shares of
    a layer's query heads and neurons: the mean over layers, which a global allocation varies)."""

    fit: int  # fit tokens: samples × max_seq_length (decoder windows are full; encoder samples at most)
    held: int  # held-aside tokens
    batch: int  # tokens per forward pass
    seq: int
    itemsize: int  # bytes of the model's dtype
    heads_cut: float
    neurons_cut: float
    criterion: str  # criterion auto resolved
    method: str
    select: str  # select auto resolved
    dense: bool  # error feedback (reconstruction.target dense)
    stats64: bool  # Gram products in float64
    recompute: bool = False  # the FFN's kept inputs computed again in the output pass (activations)

    @property
    def matrices(self) -> float:
        """Float64 C × C matrices a block's work holds (core/models/offload.py's ``Workload.matrices``;
        the obs criterion's paths, which the engine's sizing leaves out, hold the OBS selection's)."""
        obs = self.select == "obs" or self.criterion == "obs" or self.dense
        return OBS_MATRICES if obs else REFIT_MATRICES


def run_of(recipe: Recipe, shape: Shape, device: str, ratio: float | None = None) -> Run:
    """The :class:`Run` of ``recipe``'s width pruning at ``ratio`` (default the recipe's) on ``device``."""
    fam, ratio = shape.family, recipe.ratio if ratio is None else ratio
    resolved = recipe.resolved(fam.kind, shape.pools_first)
    d, hd, h = shape.hidden, shape.head_dim, shape.heads
    whole = recipe.round_to.kv_groups == "whole" or (recipe.round_to.kv_groups == "auto" and device == "cuda")
    kv_goes = not fam.gqa or shape.kv_heads == h or whole  # a query head's removal takes key/value rows with it
    head_cost = hd * 2 * d + (hd * 2 * d * shape.kv_heads / h if kv_goes else 0)
    removed = ratio * shape.block_params
    hr = recipe.head_ratio
    if recipe.modules == "neurons":
        heads = 0.0
    elif recipe.modules == "heads":
        heads = min(1.0, removed / (h * head_cost))
    else:
        heads = ratio if hr == "same" else float(hr) if isinstance(hr, (int, float)) else ratio / 2
    neuron_cost = (shape.ffn_in + 1) * d
    neurons = 0.0 if recipe.modules == "heads" else (removed - heads * h * head_cost) / (shape.ffn * neuron_cost)
    cal, dtype = recipe.calibration, dtype_of(recipe, shape, device)
    return Run(
        fit=cal.num_calibration_samples * cal.max_seq_length, held=cal.holdout_samples * cal.max_seq_length,
        batch=cal.batch_size * cal.max_seq_length, seq=cal.max_seq_length, itemsize=_ITEMSIZE[dtype],
        heads_cut=heads, neurons_cut=min(max(neurons, 0.0), 0.99),
        criterion=resolved.criterion.name, method=recipe.reconstruction.method,
        select=resolved.reconstruction.resolved_select(), dense=recipe.reconstruction.target == "dense",
        stats64=recipe.stats_dtype == "float64",
    )  # fmt: skip


_ITEMSIZE = {"float32": 4, "float16": 2, "bfloat16": 2}


def dtype_of(recipe: Recipe, shape: Shape, device: str) -> str:
    """The run's dtype as :func:`core.models.loading.resolve_dtype` picks it."""
    if recipe.dtype != "auto":
        return recipe.dtype
    stored = (shape.dtype or "").removeprefix("torch.")
    return stored if device == "cuda" and stored in ("float16", "bfloat16") else "float32"


def _gram(c: int) -> float:
    """Multiply-adds per token of a C × C Gram product over its upper block triangle
    (core/stats/accumulate.py: column blocks of at least 256 channels, at most 8 of them)."""
    k = max(1, min(8, c // 256))
    return c * c * (k + 1) / (2 * k)


def _refit(method: str, cu: float, cm: float, out: int) -> float:
    """Float64 FLOPs of one projection's solve (core/stats/reconstruct.py): a Cholesky factorisation of
    the kept channels' block (C_u³/3), triangular solves for the pruned ones (2 C_u² C_m), the weight
    update (2 C_u C_m C_out), and for liar the projection on W_u's row space."""
    if method in ("none", "bias"):
        return 2 * cm * out * (method == "bias")
    if method == "mask_tuning":
        return 2 * cu * out * (cu + cm)
    flops = cu**3 / 3 + 2 * cu * cu * cm + 2 * cu * cm * out
    if method == "liar":  # project_rows: the smaller Gram of W_u, its factorisation, and the projection
        flops += 2 * cu * out * out + out**3 / 3 if cu >= out else 2 * cu * cu * out + cu**3 / 3 + 4 * cm * cu * out
    return flops


def _obs_path(c: float, kept: float, out: int, group: int) -> float:
    """Float64 FLOPs of a greedy OBS path from ``c`` to ``kept`` channels (core/stats/select.py): the
    in-place inverse (7C³/6), then per removed channel the rank updates of H⁻¹ and of the weights
    (2 L² + 2 L C_out at L live channels, summed), and for heads each round's unit errors."""
    path = 2 / 3 * (c**3 - kept**3) + out * (c * c - kept * kept)
    rounds = (c - kept) / group if group > 1 else 0
    return 7 / 6 * c**3 + path + rounds * (c / group) * 2 * group * group * out


def layer_work(shape: Shape, run: Run) -> dict[str, float]:
    """FLOPs of one block's width pruning by kind (see the module docstring), following the passes of
    core/pipeline/blocks.py: o_proj's inputs collected (q, k, v and attention over every token), the FFN's
    (the attention replayed: o_proj on the kept channels; gate and up), the output pass (down on the kept
    neurons), a Gram product per pruned projection over the fit tokens, its solve and error report."""
    d, f, q, k = shape.hidden, shape.ffn, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    tokens = run.fit + run.held
    qkv, att, o, fin, fout = d * (q + 2 * k), 2 * run.seq * q, q * d, shape.ffn_in * d * f, f * d
    heads, neurons = run.heads_cut > 0, run.neurons_cut > 0
    cu_o, cu_f = q * (1 - run.heads_cut), f * (1 - run.neurons_cut)
    macs = tokens * (qkv + att) if heads else 0.0
    if neurons:
        macs += tokens * ((cu_o * d if heads else qkv + att + o) + fin + cu_f * d * (1 + run.recompute * shape.ffn_in))
    elif heads:
        macs += tokens * (cu_o * d + fin + fout)
    if run.dense:  # error feedback: the dense block's pass, and a second (cross) product per Gram
        macs += tokens * (qkv + att + o + fin + fout)
    parts = [(q, cu_o, shape.head_dim)] * heads + [(f, cu_f, 1)] * neurons
    gram = sum(run.fit * _gram(c) for c, _, _ in parts) * (1 + run.dense)
    fp64 = sum(_refit(run.method, cu, c - cu, d) for c, cu, _ in parts)
    if run.select == "obs":
        fp64 += sum(_obs_path(c, cu, d, g) for c, cu, g in parts)
    if run.held:  # from the held-aside inputs: the reference and both candidates' outputs
        report = sum(2 * run.held * d * (2 * c + (c - cu)) for c, cu, _ in parts)
    else:  # on the fit statistics: products of G with W and the two candidates' differences
        report = sum(6 * d * c * c for c, _, _ in parts)
    dense = 2 * macs + (0 if run.stats64 else 2 * gram)
    return {"dense": dense, "fp64": fp64 + 2 * gram * run.stats64, "report": report}


def scoring_work(shape: Shape, run: Run) -> dict[str, float]:
    """FLOPs of the criterion's scores: nothing for weight criteria; a dense pass over the fit tokens
    up to the FFN's output projection for input criteria, with for obs the dense Grams and a full OBS
    path per projection; a forward and backward pass of the whole model for gradient criteria."""
    d, f, q, k = shape.hidden, shape.ffn, shape.heads * shape.head_dim, shape.kv_heads * shape.head_dim
    per_layer = {"dense": 0.0, "fp64": 0.0, "report": 0.0}
    if run.criterion in WHOLE_MODEL_GRADIENTS:
        per_layer["dense"] = 6 * run.fit * shape.params / shape.layers
    elif run.criterion in INPUT_CRITERIA:
        per_layer["dense"] = 2 * run.fit * (d * (2 * q + 2 * k) + 2 * run.seq * q + shape.ffn_in * d * f)
        if run.criterion == "obs":
            per_layer["dense"] += 2 * run.fit * (_gram(q) + _gram(f))
            per_layer["fp64"] = _obs_path(q, shape.head_dim, d, shape.head_dim) + _obs_path(f, 1, d, 1)
    return per_layer


def work(recipe: Recipe, shape: Shape, device: str, recompute: bool = False) -> dict[str, float]:
    """FLOPs of the whole run by kind: depth pruning's span search (when blocks go), then the width
    pruning's scoring and block loop over the blocks that remain."""
    total = {"dense": 0.0, "fp64": 0.0, "report": 0.0}
    layers, ratio = shape.layers, recipe.ratio
    if recipe.removes_blocks:
        blocks = recipe.depth_blocks(shape.layers)
        _add(total, depth_work(recipe, shape, blocks))
        if recipe.modules == "blocks":
            return total
        layers, ratio = shape.layers - blocks, width_ratio(ratio, blocks / shape.layers)
    run = replace(run_of(recipe, shape, device, ratio), recompute=recompute)
    for part in (scoring_work(shape, run), layer_work(shape, run)):
        _add(total, part, layers)
    return total


def depth_work(recipe: Recipe, shape: Shape, blocks: int) -> dict[str, float]:
    """FLOPs of choosing the span (core/depth/select.py): one pass of the model over the fit windows
    with every candidate span's float64 least-squares sums (two weightings, mᵀm and mᵀ(y − r)) and
    solves, and the held-aside loss of the model without each span (twice: both fits, with ls)."""
    cal, d = recipe.calibration, shape.hidden
    fit, held = cal.num_calibration_samples * cal.max_seq_length, cal.holdout_samples * cal.max_seq_length
    held = held or cal.batch_size * cal.max_seq_length  # no held-aside windows: the fit's last batch
    spans = shape.layers - blocks
    stand_in = recipe.depth.reconstruction == "ls" or recipe.depth.select == "fit"
    losses = (2 if stand_in else 1) * (recipe.depth.select == "loss")
    head = shape.vocab * d
    dense = 2 * fit * (shape.layers * shape.block_params + head)
    dense += spans * losses * 2 * held * ((shape.layers - blocks) * shape.block_params + head)
    fp64 = spans * stand_in * 2 * (8 * fit * d * d + 8 / 3 * d**3)
    return {"dense": dense, "fp64": fp64, "report": 0.0}


def _add(total: dict[str, float], part: dict[str, float], times: float = 1) -> None:
    for key, value in part.items():
        total[key] += value * times


def activation_bytes(shape: Shape, run: Run, ffn_tokens: int) -> int:
    """:func:`core.models.offload.activation_bytes` from a shape: every token's block inputs and
    replayed outputs (two hidden-size rows where the FFN's input norm lets the attention output fold
    into the block inputs, else three), the dense model's with error feedback, and the FFN's kept
    inputs of ``ffn_tokens`` tokens (all of them, or the held-aside ones when recomputed)."""
    d, f = shape.hidden, shape.ffn
    folds = shape.family.ffn_input_norm is not None and not run.dense
    per_token = (2 if folds else 3) * d + (2 * d + f if run.dense else 0)
    return ((run.fit + run.held) * per_token + ffn_tokens * f) * run.itemsize


def working_bytes(shape: Shape, run: Run) -> int:
    """:func:`core.models.offload.block_working_bytes` from a shape: one block's weights, one batch's
    intermediate activations in float32, and the float64 C × C matrices of its statistics and solves
    (C the widest projection input: the FFN's width, or the hidden size)."""
    batch = run.batch * (4 * shape.ffn + 4 * shape.hidden) * max(run.itemsize, 4)
    return shape.block_params * run.itemsize + batch + int(run.matrices * max(shape.ffn, shape.hidden) ** 2 * 8)


@dataclass(frozen=True)
class Place:
    """Where the width phase runs: the device kind (``cpu`` or ``cuda``) and ``free``, the device memory a
    run may use (what auto's choice of the activations' place compares with)."""

    device: str
    free: int = 0


def width_peak(shape: Shape, run: Run, mode: str, layers: int, choice: str, place: Place) -> tuple[int, str]:
    """``(peak bytes, where the activations live)`` of the width pruning of ``layers`` blocks: what stays
    resident (in memory the whole model less the block counted in its work; streamed on a CPU the
    previous block while its shard is written, on a GPU nothing: the embeddings go once the first
    block's inputs exist), the activations where ``activations`` (``choice``) puts them, one block's
    work; for a stream, the first pass (embeddings and every token's hidden state) if larger."""
    device, free = place.device, place.free
    b = run.itemsize
    if mode == "memory":
        resident = (shape.outer_params + (layers - 1) * shape.block_params) * b
    else:
        resident = shape.block_params * b * (device == "cpu")
    needed, lean = activation_bytes(shape, run, run.fit + run.held), activation_bytes(shape, run, run.held)
    work = working_bytes(shape, run)
    if device == "cpu" or choice in ("device", "recompute"):
        where = "recompute" if choice in ("recompute", "host") else "device"
    elif choice == "host":
        where = "host"
    else:  # auto: the first of device, recompute, host that fits beside the block's work
        room = free - resident
        where = "device" if needed + work <= room else "recompute" if lean + work <= room else "host"
    kept = {"device": needed, "recompute": lean, "host": 0}[where]
    first = (shape.vocab * shape.hidden + (run.fit + run.held) * shape.hidden) * b if mode == "stream" else 0
    return max(resident + kept + work, first), where


def depth_peak(recipe: Recipe, shape: Shape, run: Run, blocks: int, mode: str = "memory", device: str = "cpu") -> int:
    """Peak bytes of choosing the span to remove. In memory: the model, every candidate span's float64
    sums (d × d, two per fit and two fits with a stand-in), one batch's logits in the model's dtype and
    in float32 for the held-aside loss, and the hooked blocks' outputs of that batch. Streamed
    (``core/depth/blockwise.py``): everything outside the blocks and one block, one span's sums, the
    larger pass's activations (the fit pass's ``2k + 1`` hidden-size rows per fit token, the loss pass's
    ``1 + v (n − k)`` per held-aside token, ``v`` stand-ins per candidate), the logits, and on a CPU the
    candidates' stand-ins (float64 d × d, kept on the host for the loss pass)."""
    d, spans = shape.hidden, shape.layers - blocks
    stand_in = recipe.depth.reconstruction == "ls" or recipe.depth.select == "fit"
    logits = run.batch * shape.vocab * (run.itemsize + 4)
    if mode == "memory":
        sums = spans * 4 * stand_in * d * d * 8
        hooked = 2 * spans * run.batch * d * run.itemsize
        return shape.params * run.itemsize + sums + logits + hooked
    held = run.held or run.batch  # no held-aside windows: the fit's last batch
    variants = 2 if recipe.depth.reconstruction == "ls" else 1
    rows = max((2 * blocks + 1) * run.fit, (1 + variants * spans) * held * (recipe.depth.select == "loss"))
    loss = recipe.depth.select == "loss" and recipe.depth.reconstruction == "ls"
    stand_ins = spans * 2 * d * d * 8 * loss * (device == "cpu")
    weights = (shape.outer_params + shape.block_params) * run.itemsize
    return weights + 4 * stand_in * d * d * 8 + rows * d * run.itemsize + logits + stand_ins
