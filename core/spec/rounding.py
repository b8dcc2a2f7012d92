"""The recipe's ``round_to`` field: hardware-friendly multiples of the kept widths. Torch-free, like the
rest of ``core.spec``."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class RoundTo(_Strict):
    heads: int = Field(1, ge=1, description="kept query heads per layer: a multiple of this")
    neurons: int | Literal["auto"] = Field(
        "auto",
        description="kept FFN neurons per layer: a multiple of this; 'auto' picks one that suits the device "
        "(128 on a GPU, 64 on a CPU, smaller for narrow FFNs, none below 8) — exact widths ran slower than "
        "dense on a GPU; 1 keeps exact widths",
    )
    kv_groups: Literal["free", "whole", "auto"] = Field(
        "free",
        description="grouped-query attention: whole — every layer drops query heads only as whole key/value "
        "groups, so each layer is a stock GQA attention (equal groups, no key/value gather; a uniform prune "
        "exports as the stock architecture), the budget they cost rebalanced in neurons; free — query heads "
        "go one at a time and a layer whose groups end up unequal gathers its key/value heads by index; "
        "auto — whole on a GPU (free there for a single key/value head, or a ratio whole groups cannot "
        "reach), free on a CPU. No effect without grouped-query attention",
    )

    k_quant: bool = Field(
        False,
        description="llama.cpp's K- and i-quants pack rows in blocks of 256: keep the pruned projections' row "
        "lengths (the attention output's kept query heads × head_dim, the FFN down projection's kept neurons) "
        "multiples of 256 where the model's widths allow it, so no pruned tensor falls back to a larger legacy "
        "type (Q5_0, Q8_0) in a q*_k_m file; heads and neurons become the multiples that give it (with "
        "kv_groups: free)",
    )

    @field_validator("neurons")
    @classmethod
    def _positive(cls, v: int | str) -> int | str:
        if v != "auto" and (isinstance(v, bool) or v < 1):
            raise ValueError(f"round_to.neurons must be 'auto' or a whole number ≥ 1, got {v!r}")
        return v
