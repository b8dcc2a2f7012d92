"""The recipe's depth and speed fields: whole blocks removed (``depth``) and a speed-up in place of the
ratio (``target``). Torch-free, like the rest of ``core.spec``."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

# Held-aside samples of a speed-target recipe that does not say how many: its choice among candidates
# rests on their loss, and 8 windows of 128 tokens ranked two SmolLM2 prunes of one speed the wrong way
# round (loss 5.031 against 5.087, held-out perplexity 318.5 against 250.7), where 80 windows of 128
# tokens of the held-out text ranked them right (docs/results/speed_target.md)
TARGET_HOLDOUT = 32


def hold_aside_for_target(data: Any) -> Any:
    """A recipe's raw fields with ``calibration.holdout_samples: TARGET_HOLDOUT`` where they name a speed
    target and no held-aside count (the recipe's validation runs this first)."""
    if not isinstance(data, dict) or data.get("target") is None:
        return data
    cal = data.get("calibration")
    if isinstance(cal, dict) and "holdout_samples" not in cal:
        return data | {"calibration": cal | {"holdout_samples": TARGET_HOLDOUT}}
    if isinstance(cal, BaseModel) and "holdout_samples" not in cal.model_fields_set:
        return data | {"calibration": cal.model_copy(update={"holdout_samples": TARGET_HOLDOUT})}
    return data


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class DepthConfig(_Strict):
    blocks: int = Field(
        0,
        ge=0,
        le=10_000,
        description="whole transformer blocks removed (one contiguous span) before the width pruning, their "
        "parameters counted in ratio (the heads and neurons then remove the rest); 0: none. With modules: blocks "
        "leave it 0: the ratio gives the count",
    )
    select: Literal["loss", "fit", "angular"] = Field(
        "loss",
        description="which span goes: loss — the least next-token loss on the held-aside calibration windows "
        "with the span removed as reconstruction says (with ls: the stand-in's own error end to end; with none: "
        "SLEB's criterion); fit — the least error of the least-squares stand-in on the calibration tokens; "
        "angular — the least angular distance between the span's input and output (ShortGPT)",
    )
    reconstruction: Literal["ls", "none"] = Field(
        "ls",
        description="ls: the span replaced by a linear map fitted by least squares and folded into the down "
        "projection of the block before it (the result is the stock architecture with fewer layers; not for "
        "families that normalise the FFN's output, as Gemma does); none: the blocks removed",
    )
    damp: float = Field(0.01, ge=0.0, description="the stand-in's ridge damping, a fraction of mean(diag G)")


SPEED_WORKLOADS = ("decode_b1", "prefill_b8x512")  # what core.evaluation.latency times


class SpeedTarget(_Strict):
    speedup: float = Field(
        ...,
        gt=1.0,
        le=20.0,
        description="how many times faster than the dense model, measured on the device that runs the prune",
    )
    workload: Literal[SPEED_WORKLOADS] = Field(
        "decode_b1",
        description="what is timed: decode_b1 — batch-1 greedy decoding, ms per token (the latency a chat user "
        "feels); prefill_b8x512 — one forward over 8 prompts of 512 tokens",
    )
    depth: bool = Field(
        True,
        description="whether whole blocks may go beside heads and neurons (modules: blocks: only blocks go)",
    )
    candidates: int = Field(
        4,
        ge=1,
        le=12,
        description="recipes that reach the speed-up on the latency table (from width only to depth only), "
        "each pruned in full and timed against the dense model (one that falls short is corrected, twice at most); "
        "the least held-aside loss among those that realise the speed-up is kept",
    )
