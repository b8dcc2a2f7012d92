"""Depth pruning's least-squares stand-in: a span of whole blocks replaced by one linear map, folded
into the down projection of the block before it, so the result is the stock architecture with fewer
layers.

Let block ``s - 1`` be the last block kept before the span ``[s, e)``. Its residual stream after the
attention is ``r``, its FFN adds ``m = z W_downᵀ + b`` (``z``: the FFN's hidden activations), and the
span maps ``h = r + m`` to ``y``. The stand-in keeps ``r`` and replaces ``m`` by ``m T`` with

    T = argmin_T ‖m T − (y − r)‖² + λ ‖T‖²  =  (mᵀm + λ I)⁻¹ mᵀ(y − r),

the map ReplaceMe fits (arXiv 2505.02819) written as a refit of the FFN's output: ``m T = z (W_downᵀ T)
+ b T``, i.e. ``W_down ← Tᵀ W_down`` and ``b ← b T``. The statistics ``mᵀm`` and ``mᵀ(y − r)`` are
summed over batches in float64 (:class:`SpanFit`), as the width refits are, and the damping is relative
to the Gram's mean diagonal. This needs a pre-norm block whose FFN output joins the residual stream
as it is: a family with a norm on the FFN's output (Gemma's sandwich norms) cannot take the fold, and
nor can a span that starts at the first block (there is no FFN before it to fold into).

:func:`plain_error` and :func:`angular_distance` are the span scores of plain removal and of ShortGPT.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from core.models.adapter import Adapter


class DepthError(ValueError):
    """A span that cannot be replaced as asked (the message says why)."""


@dataclass
class SpanFit:
    """Streamed least squares for one span: ``add_batch`` per calibration batch, then ``solve``."""

    width: int
    device: torch.device | str = "cpu"  # where the sums live (the model's device: no copies per batch)
    gram: torch.Tensor = field(init=False)  # mᵀm, float64
    cross: torch.Tensor = field(init=False)  # mᵀ(y − r), float64
    target_sq: float = 0.0  # ‖y − r‖², for the relative error
    rows: int = 0

    def __post_init__(self) -> None:
        self.gram = torch.zeros(self.width, self.width, dtype=torch.float64, device=self.device)
        self.cross = torch.zeros(self.width, self.width, dtype=torch.float64, device=self.device)

    def add_batch(self, m: torch.Tensor, delta: torch.Tensor, scale: torch.Tensor | None = None) -> None:
        """``m``: the FFN output of the block before the span; ``delta``: ``y − r`` (tokens × width);
        ``scale``: a weight per token row (both sides multiplied by it), None for plain least squares."""
        where = self.gram.device
        m, delta = (
            m.reshape(-1, self.width).to(where, torch.float64),
            delta.reshape(-1, self.width).to(where, torch.float64),
        )
        if scale is not None:
            w = scale.reshape(-1, 1).to(where, torch.float64)
            m, delta = m * w, delta * w
        self.gram += m.T @ m
        self.cross += m.T @ delta
        self.target_sq += float((delta * delta).sum())
        self.rows += m.shape[0]

    def solve(self, damp: float = 0.01) -> torch.Tensor:
        """``T`` (width × width, float64), the damping ``damp`` × the Gram's mean diagonal."""
        if self.rows == 0:
            raise DepthError("no calibration tokens reached the span")
        lam = damp * float(self.gram.diagonal().mean())
        reg = self.gram + lam * torch.eye(self.width, dtype=torch.float64, device=self.gram.device)
        return torch.linalg.solve(reg, self.cross).cpu()

    def relative_error(self, t: torch.Tensor) -> float:
        """‖m T − (y − r)‖² / ‖y − r‖² on the summed statistics (the fit's own tokens)."""
        if self.target_sq == 0.0:
            return 0.0
        t = t.to(self.gram.device, torch.float64)
        residual = self.target_sq - 2 * float((t * self.cross).sum()) + float((t * (self.gram @ t)).sum())
        return max(residual, 0.0) / self.target_sq


def check_foldable(adapter: Adapter, start: int) -> None:
    if start < 1:
        raise DepthError("a span starting at the first block has no FFN before it to fold its stand-in into")
    if adapter.family.ffn_output_norm is not None:
        raise DepthError(
            f"{adapter.family.label or adapter.family.name} normalises the FFN's output before the residual "
            "stream, so a linear stand-in cannot be folded into the down projection"
        )


def fold(model: nn.Module, adapter: Adapter, start: int, t: torch.Tensor) -> None:
    """``W_down ← Tᵀ W_down`` and ``b ← b T`` in block ``start - 1`` (see the module docstring)."""
    check_foldable(adapter, start)
    fold_linear(adapter.layers(model)[start - 1].get_submodule(adapter.family.ffn_out), t)


def fold_linear(down: nn.Linear, t: torch.Tensor) -> None:
    """``W ← Tᵀ W`` and ``b ← b T`` in the projection ``down`` (in float64, stored in its dtype); a
    parameter still on the meta device (a streamed block read in part) is left as it is."""
    with torch.no_grad():
        w = down.weight
        if not w.is_meta:
            w.copy_((t.T.to(w.device, torch.float64) @ w.double()).to(w.dtype))
        b = down.bias
        if b is not None and not b.is_meta:
            b.copy_((b.double() @ t.to(b.device, torch.float64)).to(b.dtype))


def set_layers(model: nn.Module, adapter: Adapter, layers: nn.ModuleList) -> None:
    """Make ``layers`` the model's list of blocks (where ``adapter.layers`` reads it)."""
    parent_path, _, name = adapter.family.layers.rpartition(".")
    parent = model.base_model.get_submodule(parent_path) if parent_path else model.base_model
    setattr(parent, name, layers)


def remove_blocks(model: nn.Module, adapter: Adapter, drop: list[int]) -> None:
    """Take blocks ``drop`` out of the model: the kept ones renumbered (their attention's ``layer_idx``,
    which the key/value cache reads), the config's layer count and per-layer lists trimmed."""
    layers = adapter.layers(model)
    drop_set = set(drop)
    if len(drop_set) >= len(layers):
        raise DepthError("removing every block leaves no model")
    kept = [layer for i, layer in enumerate(layers) if i not in drop_set]
    for new_index, layer in enumerate(kept):
        attn = layer.get_submodule(adapter.family.attn)
        if hasattr(attn, "layer_idx"):
            attn.layer_idx = new_index
    set_layers(model, adapter, nn.ModuleList(kept))
    cfg = model.config
    for key, values in per_layer_lists(cfg, len(layers)).items():
        setattr(cfg, key, [v for i, v in enumerate(values) if i not in drop_set])
    cfg.num_hidden_layers = len(kept)


PER_LAYER_KEYS = ("layer_types", "liar_layout")  # config lists with one entry per block


def per_layer_lists(cfg, n: int) -> dict[str, list]:
    """The config's lists with one entry per block (``layer_types``: the base model gives the block at
    position i the mask and rotary embeddings of ``layer_types[i]``, so they follow the blocks)."""
    out = {}
    for key in PER_LAYER_KEYS:
        values = getattr(cfg, key, None)
        if isinstance(values, list) and len(values) == n:
            out[key] = values
    return out


def angular_distance(h_in: torch.Tensor, h_out: torch.Tensor) -> float:
    """ShortGPT's span score: the mean angle between a token's residual stream before and after the
    span, over π (0: the span changes no direction)."""
    a, b = h_in.reshape(-1, h_in.shape[-1]).double(), h_out.reshape(-1, h_out.shape[-1]).double()
    cos = torch.nn.functional.cosine_similarity(a, b, dim=-1).clamp(-1.0, 1.0)
    return float(torch.arccos(cos).mean() / torch.pi)


def plain_error(h_in: torch.Tensor, h_out: torch.Tensor) -> float:
    """Plain removal's relative error ‖h_in − h_out‖² / ‖h_out‖² (the span passes its input on)."""
    d = h_out.double() - h_in.double()
    return float((d * d).sum() / (h_out.double() ** 2).sum().clamp_min(1e-300))


def _hidden(output) -> torch.Tensor:
    return output[0] if isinstance(output, tuple) else output


def token_scale(y: torch.Tensor) -> torch.Tensor:
    """``1 / ‖y_t‖`` per token: the fit then weighs each token's direction, as the next block's RMS norm
    reads it, instead of letting the few tokens with massive activations (the first token's residual
    stream is orders of magnitude larger) decide the map."""
    return 1.0 / y.double().norm(dim=-1).clamp_min(1e-12)


@dataclass
class SpanTotals:
    """One span's statistics over the calibration tokens: the stand-in's fits (per-token weighted:
    True, plain: False) and the two scores' sums."""

    fits: dict[bool, SpanFit]
    plain: list[float] = field(default_factory=lambda: [0.0, 0.0])  # ‖y − h‖², ‖y‖²
    angle: list[float] = field(default_factory=lambda: [0.0, 0.0])  # summed angle, tokens

    def add(self, m: torch.Tensor | None, h: torch.Tensor, y: torch.Tensor) -> None:
        h, y = h.double(), y.double()
        for weighted, fit in self.fits.items():
            fit.add_batch(m.double(), y - h + m.double(), token_scale(y) if weighted else None)
        d = y - h
        self.plain[0] += float((d * d).sum())
        self.plain[1] += float((y * y).sum())
        self.angle[0] += angular_distance(h, y) * h.shape[0]
        self.angle[1] += h.shape[0]

    def scores(self) -> dict[str, float]:
        return {
            "plain_error": self.plain[0] / max(self.plain[1], 1e-300),
            "angular_distance": self.angle[0] / max(self.angle[1], 1),
        }


def model_inputs(batch, adapter: Adapter, device) -> dict:
    """A calibration batch (a :class:`CalibrationBatch`, or a dict of ``input_ids`` and
    ``attention_mask``) as the model's keyword arguments on ``device``."""
    if isinstance(batch, dict):
        inputs = {k: v.to(device) if torch.is_tensor(v) else v for k, v in batch.items()}
        if adapter.kind == "decoder":  # as CalibrationBatch.model_inputs: no key/value cache
            inputs.setdefault("use_cache", False)
        return inputs
    return batch.model_inputs(adapter.kind, device)


@torch.no_grad()
def fit_spans_weighted(
    model: nn.Module,
    adapter: Adapter,
    batches,
    spans: list[tuple[int, int]],
    weightings: tuple[bool, ...] = (True, False),
) -> dict[tuple[int, int], tuple[dict[bool, SpanFit], dict[str, float]]]:
    """The least-squares statistics of replacing each span ``[start, end)`` of blocks (see the module
    docstring) over ``batches`` (:func:`model_inputs`), per-token weighted and/or plain (``weightings``),
    with its plain-removal and angular scores on the same tokens, all from one pass. Hooks read each
    block's output ``h`` and its down projection's output ``m`` (so ``r = h − m``) where a span needs
    them; a span's ``y`` is its last block's output."""
    layers = adapter.layers(model)
    for start, end in spans:
        if weightings:  # the stand-in needs somewhere to fold into (scores alone do not)
            check_foldable(adapter, start)
        if not 0 < start < end <= len(layers):
            raise DepthError(f"span [{start}, {end}) is not inside the model's {len(layers)} blocks")
    outs: dict[int, torch.Tensor] = {}
    downs: dict[int, torch.Tensor] = {}
    hooks = []
    for i in sorted({s - 1 for s, _ in spans} | {e - 1 for _, e in spans}):
        hooks.append(layers[i].register_forward_hook(lambda mod, inp, out, i=i: outs.__setitem__(i, _hidden(out))))
    for i in sorted({s - 1 for s, _ in spans}) if weightings else ():
        down = layers[i].get_submodule(adapter.family.ffn_out)
        hooks.append(down.register_forward_hook(lambda mod, inp, out, i=i: downs.__setitem__(i, out)))
    device = next(model.parameters()).device
    width = model.config.hidden_size
    totals = {span: SpanTotals({w: SpanFit(width, device) for w in weightings}) for span in spans}
    try:
        for batch in batches:
            inputs = model_inputs(batch, adapter, device)
            mask = inputs["attention_mask"].bool()
            model(**inputs)
            for (start, end), t in totals.items():
                m = downs[start - 1][mask] if weightings else None
                t.add(m, outs[start - 1][mask], outs[end - 1][mask])
    finally:
        for hook in hooks:
            hook.remove()
    return {span: (t.fits, t.scores()) for span, t in totals.items()}


def fit_spans(
    model: nn.Module, adapter: Adapter, batches, spans: list[tuple[int, int]], normalise: bool = True
) -> dict[tuple[int, int], tuple[SpanFit, dict[str, float]]]:
    """:func:`fit_spans_weighted` with one weighting: per-token (``normalise``) or plain."""
    both = fit_spans_weighted(model, adapter, batches, spans, (normalise,))
    return {span: (fits[normalise], scores) for span, (fits, scores) in both.items()}


def fit_span(
    model: nn.Module, adapter: Adapter, batches, start: int, end: int, normalise: bool = True
) -> tuple[SpanFit, dict[str, float]]:
    """:func:`fit_spans` for the one span ``[start, end)``."""
    return fit_spans(model, adapter, batches, [(start, end)], normalise)[(start, end)]
