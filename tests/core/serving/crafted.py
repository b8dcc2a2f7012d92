"""A pruned checkpoint of a hand-written layout, for the engine tests (both engine forms read it)."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.models.export import write_config
from core.models.modeling_liar import apply_layout


def crafted_checkpoint(
    src: Path, out: Path, layout: list[dict], family: str = "llama", seed: int = 3, bias_scale: float = 1.0
) -> Path:
    """``src`` cut to ``layout`` and written to ``out`` in the ``liar_`` form, every bias (those the
    layout adds included) set to ``bias_scale`` × standard normal values."""
    model = AutoModelForCausalLM.from_pretrained(src, dtype=torch.float32)
    apply_layout(model, family, layout)
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.copy_(bias_scale * torch.randn(p.shape, generator=gen))
    model.config.liar_layout = layout
    out.mkdir()
    model.save_pretrained(out)
    write_config(model, family, layout, out)
    AutoTokenizer.from_pretrained(src).save_pretrained(out)
    return out
