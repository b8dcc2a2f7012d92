"""The recipe: everything one pruning run needs, as one validated object.

The same object is the CLI's input (YAML), the Python API's argument, the job payload, the database
record and the ``recipe.yaml`` inside every exported checkpoint.

Example::

    model: HuggingFaceTB/SmolLM2-135M-Instruct
    modules: both            # heads | neurons | both | blocks (depth only: round(ratio × layers) whole blocks)
    ratio: 0.2               # fraction of the transformer blocks' parameters removed
    depth: {blocks: 0, select: loss, reconstruction: ls}   # whole blocks removed first, counted in ratio
    # target: {speedup: 1.5, workload: decode_b1}  # in place of ratio: a speed-up (decode_b1 | prefill_b8x512)
    allocation: auto         # auto | uniform | global
    head_ratio: auto         # uniform: heads removed per layer — auto (half the ratio) | same | obs | 0.25
    criterion: {name: auto}  # auto: obs + global for decoders up to 50% (capped above 30%), else uniform shares
    reconstruction: {method: ls, damp: 0.001, select: auto}   # paper: {method: liar, select: criterion}
    calibration:
      dataset: wikitext2     # a named set, or a local .txt / .jsonl file
      num_calibration_samples: 128
      max_seq_length: 128
      seed: 0
    dtype: auto
    device: auto
    activations: auto        # GPU: calibration activations on the device, or in host memory when too big
    query_heads: free        # uniform: every layer keeps as many query heads (vLLM's form needs it)
    export: []               # serving files written into the checkpoint: gguf-f16 | gguf-q8_0 | gguf-q4_k_m | … | vllm
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal, get_args

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from core.spec.criteria import CRITERIA, parse_options, streaming_refusal
from core.spec.depth import TARGET_HOLDOUT, DepthConfig, SpeedTarget, hold_aside_for_target
from core.spec.rounding import RoundTo

NAMED_DATASETS = ("wikitext2", "c4", "alpaca")
# criterion ``auto`` spends a decoder's budget non-uniformly (criterion obs, allocation global) up to
# AUTO_OBS_MAX_RATIO, uniformly (magnitude) beyond it; above AUTO_OBS_FREE_RATIO no layer loses more
# than AUTO_OBS_CAP × the ratio of its heads or of its neurons (obs's max_layer_ratio). Measured on
# SmolLM2-135M and Gemma 3 270M (docs/results/obs_allocation.md): uncapped obs counts are best at 20%
# and 30% and collapse at 40% and 50% (many consecutive layers cut to a twentieth), where the cap at
# 1.2 × the ratio is best of every recipe measured
AUTO_OBS_FREE_RATIO = 0.3
AUTO_OBS_MAX_RATIO = 0.5
AUTO_OBS_CAP = 1.2
# Bounds of the size-like fields: generous for real runs, but an input that would make a worker grow
# until it is killed (a billion calibration samples) is refused at submission.
MAX_SAMPLES = 100_000
MAX_SEQ_LEN = 131_072
MAX_BATCH = 4_096
MAX_CALIBRATION_TOKENS = 2**24  # samples × sequence length: ≈ 137 GB of a 7B model's bf16 hidden states
# reconstruction methods (implemented in core.stats.reconstruct, which checks it matches this list)
METHODS = ("none", "bias", "mask_tuning", "liar", "ls")
# the serving forms ``export`` may ask for (written by core.serving, whose FORMATS is this tuple): GGUF for
# llama.cpp / ollama in float16, or quantized by llama.cpp's own quantizer; vLLM's DeciLM form
# GGUF weight types `liar export` writes: f32 / f16 by the export itself, the rest by llama.cpp's quantizer
GGUF_TYPES = ("f32", "f16", "q8_0", "q5_k_m", "q4_k_m", "q3_k_m", "iq3_xxs", "iq2_m")
# the forms a recipe's export names: a GGUF of each type but f32 (llama.cpp), and vLLM's DeciLM form
EXPORT_FORMATS = (*(f"gguf-{t}" for t in GGUF_TYPES if t != "f32"), "vllm")
# form name → GGUF weight type; "vllm" is a folder, no GGUF
GGUF_FORMATS = {f: f.removeprefix("gguf-") for f in EXPORT_FORMATS if f.startswith("gguf-")}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class CriterionConfig(_Strict):
    name: str = Field(
        "auto",
        description="pruning criterion (see core.criteria.base.CRITERIA), or auto: obs with allocation global for "
        f"a decoder pruned by at most {AUTO_OBS_MAX_RATIO:.0%} with the default reconstruction-aware selection "
        f"(measured best there; above {AUTO_OBS_FREE_RATIO:.0%} no layer loses more than {AUTO_OBS_CAP} × the "
        "ratio of its units) or with allocation global; kwon (Kwon et al.'s Fisher search, global) for an encoder "
        "sequence classifier calibrated on labelled samples; otherwise uniform shares, by flap for a decoder whose "
        "units the criterion picks (select criterion: reconstruction none, bias or mask_tuning, or the paper's "
        "LIAR) and by magnitude where obs selection picks them",
    )
    options: dict[str, Any] = Field(default_factory=dict, description="criterion-specific options")

    @field_validator("name")
    @classmethod
    def _known(cls, v: str) -> str:
        if v != "auto" and v not in CRITERIA:
            raise ValueError(f"unknown criterion {v!r}; choose one of {['auto', *sorted(CRITERIA)]}")
        return v

    @model_validator(mode="after")
    def _auto_has_no_options(self) -> CriterionConfig:
        if self.name == "auto" and self.options:
            raise ValueError("criterion auto takes no options: name the criterion whose options these are")
        return self


class ReconstructionConfig(_Strict):
    method: str = Field(
        "ls",
        description="none | bias | mask_tuning | liar | ls (the default: the exact refit, measured best; liar is "
        "the paper's)",
    )
    damp: float = Field(1e-3, ge=0.0, description="ridge damping, a fraction of mean(diag G)")
    select: Literal["auto", "criterion", "obs"] = Field(
        "auto",
        description="which units a layer drops (the count is the allocation's): the criterion's lowest-scored, "
        "or obs — those whose removal the least-squares refit compensates best, chosen greedily on the "
        "calibration statistics (structured optimal brain surgeon); auto: obs when refitted by ls or liar "
        "(measured best on SmolLM2 and MiniLM), criterion otherwise",
    )
    target: Literal["pruned", "dense"] = Field(
        "pruned",
        description="what a pruned layer is refitted to: its own output on the pruned model's inputs (the "
        "paper), or dense — the dense model's output (error feedback: each layer also undoes the errors of "
        "the pruned layers before it); dense needs method ls",
    )
    positions: Literal["all", "first", "pooled"] = Field(
        "all",
        description="token positions the reconstruction fits: all — every real token; pooled (encoder "
        "sequence classifiers) — every token in the blocks below the last, and in the last block, whose other "
        "positions the classifier never reads, only each sequence's first ([CLS]) token; first — the first "
        "token in every block",
    )

    @field_validator("method")
    @classmethod
    def _known(cls, v: str) -> str:
        if v not in METHODS:
            raise ValueError(f"unknown reconstruction method {v!r}; choose one of {sorted(METHODS)}")
        return v

    def resolved_select(self) -> str:
        """``select`` with ``auto`` resolved: obs when a least-squares refit follows (ls, liar)."""
        if self.select != "auto":
            return self.select
        return "obs" if self.method in ("ls", "liar") else "criterion"

    @model_validator(mode="after")
    def _target_needs_ls(self) -> ReconstructionConfig:
        if self.target == "dense" and self.method != "ls":
            raise ValueError(
                f"target 'dense' (error feedback) is an exact least-squares refit: use method 'ls', not {self.method!r}"
            )
        return self


class CalibrationConfig(_Strict):
    dataset: str | None = Field(None, description=f"a named set {NAMED_DATASETS} or a local .txt / .jsonl / .json file")
    texts: list[str] | None = Field(None, description="calibration texts given inline")
    text_field: str | list[str] = Field(
        "text", description="field(s) of a .jsonl record holding text; two fields form an encoder pair"
    )
    label_field: str | None = Field(
        None, description="field of a .jsonl / .json record holding a numeric task label (gradient criteria, encoders)"
    )
    num_calibration_samples: int = Field(
        128, gt=0, le=MAX_SAMPLES, description="windows (decoders) or texts (encoders)"
    )
    max_seq_length: int = Field(128, gt=1, le=MAX_SEQ_LEN, description="tokens per window")
    holdout_samples: int = Field(
        8,
        ge=0,
        le=MAX_SAMPLES,
        description=f"extra samples held aside to measure reconstruction error (0: fit data; target: {TARGET_HOLDOUT})",
    )
    seed: int = 0
    batch_size: int = Field(8, gt=0, le=MAX_BATCH, description="samples per forward pass")

    @model_validator(mode="after")
    def _bounded(self) -> CalibrationConfig:
        tokens = (self.num_calibration_samples + self.holdout_samples) * self.max_seq_length
        if tokens > MAX_CALIBRATION_TOKENS:
            raise ValueError(
                f"calibration of {self.num_calibration_samples + self.holdout_samples} samples × "
                f"{self.max_seq_length} tokens = {tokens:,} tokens exceeds the limit of "
                f"{MAX_CALIBRATION_TOKENS:,}; lower num_calibration_samples or max_seq_length"
            )
        return self

    @model_validator(mode="after")
    def _one_source(self) -> CalibrationConfig:
        if (self.dataset is None) == (self.texts is None):
            raise ValueError("calibration needs exactly one of 'dataset' (name or file) or 'texts'")
        if self.texts is not None and not any(t.strip() for t in self.texts):
            raise ValueError("calibration 'texts' are all empty")
        if self.dataset is not None and self.dataset not in NAMED_DATASETS:
            path = Path(self.dataset).expanduser()
            if not path.is_file():
                raise ValueError(
                    f"calibration dataset {self.dataset!r} is neither a named set {NAMED_DATASETS} nor an existing file"
                )
            if path.suffix.lower() not in (".txt", ".jsonl", ".json"):
                raise ValueError(f"calibration file {self.dataset!r} must be .txt, .jsonl or .json")
            if path.stat().st_size == 0 or not path.read_text(encoding="utf-8", errors="replace").strip():
                raise ValueError(f"calibration file {self.dataset!r} is empty")
        if self.label_field is not None and (self.dataset is None or not self.dataset.endswith((".jsonl", ".json"))):
            raise ValueError("calibration.label_field needs a .jsonl or .json calibration file whose records hold it")
        return self


class Recipe(_Strict):
    model: str = Field(..., description="Hugging Face model id or local directory")
    modules: Literal["heads", "neurons", "both", "blocks"] = Field(
        "both",
        description="what is pruned: attention heads, FFN neurons, both, or blocks — whole transformer blocks "
        "only (depth pruning: round(ratio × layers) of them, see depth)",
    )
    ratio: float | None = Field(
        None, description="fraction of the transformer blocks' parameters removed, in (0, 1) (or give a target)"
    )
    target: SpeedTarget | None = Field(
        None,
        description="a speed-up in place of ratio: the worker measures a latency table of the model's block on "
        "its own device, then keeps the depth and widths that reach it with the least held-aside loss",
    )
    depth: DepthConfig = Field(default_factory=DepthConfig, description="whole blocks removed (depth pruning)")
    allocation: Literal["auto", "uniform", "global"] = Field(
        "auto",
        description="how many units each layer loses: uniform (every layer the ratio), global (one ranking over "
        "all layers), or auto: the one the criterion needs, global for criterion auto when it resolves to obs, "
        "else uniform",
    )
    head_ratio: float | Literal["auto", "same", "obs"] = Field(
        "auto",
        description="uniform allocation pruning heads and neurons: the fraction of each layer's query heads "
        "(whole key/value groups under round_to.kv_groups: whole) removed, the neurons making up the rest of "
        "the layer's share — same: the layer's ratio (the paper's split); auto: half of it (measured best: "
        "heads are coarse units the refit recovers worse than neurons, docs/results/head_ratio.md); obs: "
        "each layer's own split, the one with the least output error on the OBS selection's error curves of "
        "o_proj and the FFN's down projection (needs select obs); or a fraction in [0, 1)",
    )
    query_heads: Literal["free", "uniform"] = Field(
        "free",
        description="uniform: every layer keeps the same number of query heads (the heads' share of a uniform "
        "plan, head_ratio), while FFN widths and key/value heads still differ per layer under global "
        "allocation; vLLM's form (export vllm) needs it, since vLLM states one query-head count for all layers",
    )
    round_to: RoundTo = Field(
        default_factory=RoundTo, description="round kept widths to hardware-friendly multiples (1 = no rounding)"
    )
    criterion: CriterionConfig = Field(default_factory=CriterionConfig)
    reconstruction: ReconstructionConfig = Field(default_factory=ReconstructionConfig)
    calibration: CalibrationConfig
    dtype: Literal["auto", "float32", "float16", "bfloat16"] = "auto"
    device: str = Field("auto", description="auto | cpu | cuda | cuda:N")
    stats_dtype: Literal["float32", "float64"] = Field(
        "float32", description="precision of each batch's XᵀX product (running totals are float64)"
    )
    execution: Literal["auto", "stream", "memory"] = Field(
        "auto",
        description="stream: one block at a time from the checkpoint's shards, written out as it is pruned "
        "(auto picks it when the model is read from a directory or the hub and the result is saved; stream "
        "also keeps host memory bounded on a CPU, where auto does so only for weights above an eighth of the "
        "memory available); memory: the whole model on the device",
    )
    activations: Literal["auto", "device", "recompute", "host"] = Field(
        "auto",
        description="where the calibration activations live between blocks on a GPU: device; recompute (on the "
        "device, but the FFN's kept inputs, the widest of them, are computed again in each block's output pass "
        "instead of kept); host (pinned host memory, copied in as each block uses them; the FFN's inputs "
        "recomputed); or auto: the first of device, recompute, host that fits in the free device memory beside "
        "a block's work (a CPU run keeps them where it computes: auto is device there, host is recompute)",
    )
    export: list[str] = Field(
        default_factory=list,
        description=f"serving files written into the checkpoint after it is saved, each listed in its "
        f"SHA256SUMS and model card: any of {', '.join(EXPORT_FORMATS)} (GGUF runs in llama.cpp and ollama; "
        "q4_k_m is about a quarter of f16's size; the quantized forms need llama.cpp where the run happens and are "
        "weighted by an importance matrix from the calibration text; iq3_xxs and iq2_m cannot do without one). "
        "Checked against the model before any pruning; a form named twice is written once",
    )

    @model_validator(mode="after")
    def _criterion_fits(self) -> Recipe:
        if self.criterion.name != "auto":
            parse_options(self.criterion.name, self.criterion.options, self.modules, self.allocation)
        refusal = streaming_refusal(self.criterion.name) if self.execution == "stream" else None
        if refusal:
            raise ValueError(refusal)
        return self

    @model_validator(mode="before")
    @classmethod
    def _target_holds_more_aside(cls, data: Any) -> Any:
        return hold_aside_for_target(data)

    @model_validator(mode="after")
    def _ratio_or_target(self) -> Recipe:
        if (self.ratio is None) == (self.target is None):
            raise ValueError(
                "give either ratio (the fraction of block parameters removed) or target (a speed-up), "
                + ("not both" if self.ratio is not None else "neither was given")
            )
        if self.target is not None and self.depth.blocks:
            raise ValueError("a speed target chooses how many blocks go: leave depth.blocks 0")
        if self.target is not None and self.execution == "stream":
            raise ValueError("a speed target compares whole pruned models in memory: use execution memory or auto")
        return self

    @model_validator(mode="after")
    def _depth_fits(self) -> Recipe:
        if self.modules == "blocks" and self.depth.blocks:
            raise ValueError(
                "modules: blocks removes round(ratio × layers) whole blocks; depth.blocks is the depth share of a "
                "width recipe (heads, neurons or both): give one or the other"
            )
        return self

    @property
    def removes_blocks(self) -> bool:
        """Whether whole blocks go (``modules: blocks`` or ``depth.blocks``)."""
        return self.modules == "blocks" or self.depth.blocks > 0

    def depth_blocks(self, n_layers: int) -> int:
        """How many whole blocks a model of ``n_layers`` loses."""
        if self.modules == "blocks":
            return max(1, round(self.ratio * n_layers))
        return self.depth.blocks

    @property
    def auto_may_use_gradients(self) -> bool:
        """Whether criterion auto may resolve to a criterion that needs gradients of the whole model
        (Kwon et al.'s, for a labelled sequence classifier; labels are taken by encoders only): such a
        run cannot stream, so ``execution: auto`` keeps the model in memory, and ``execution: stream``
        keeps auto off gradient criteria."""
        return self.criterion.name == "auto" and self.calibration.label_field is not None and self.execution != "stream"

    def resolved(self, kind: str, pools_first: bool = False) -> Recipe:
        """This recipe with ``criterion: auto`` and ``allocation: auto`` made concrete for a model of
        ``kind`` ("decoder" | "encoder"; ``pools_first``: an encoder whose task head reads only the
        first token, a sequence classifier): what runs, and what the result and its checkpoint record.

        Criterion auto is Kwon et al.'s (``kwon``, allocation global, its own units: select auto becomes
        ``criterion``) for a sequence classifier calibrated on labelled samples (``calibration.label_field``)
        and pruned in heads and neurons, unless it must stream (:attr:`auto_may_use_gradients`). Otherwise
        it is ``obs`` with allocation global for a decoder pruned by at most ``AUTO_OBS_MAX_RATIO`` (heads
        and neurons, uniform-or-auto allocation, the default reconstruction-aware selection, heads not
        split by ``head_ratio: obs``), or for any model when allocation is global. Otherwise the
        shares are uniform: ``flap`` for a decoder whose units the criterion picks (select resolves to
        ``criterion``; without a refit, magnitude's units wreck a decoder: docs/results/criteria.md),
        ``magnitude`` where obs picks them (the criterion then sets nothing but the uniform counts).
        Above ``AUTO_OBS_FREE_RATIO`` the obs it picks has ``max_layer_ratio``
        ``AUTO_OBS_CAP`` × the ratio, a soft cap (``over_cap: last``: units past it go only when the
        ratio cannot be reached otherwise, as on models with few heads)."""
        name, alloc, options = self.criterion.name, self.allocation, self.criterion.options
        recon = self.reconstruction
        fisher = kind == "encoder" and pools_first and self.modules == "both" and alloc in ("auto", "global")
        if self.auto_may_use_gradients and fisher:
            name, alloc = "kwon", "global"
            if recon.select == "auto":  # its mask search and rearrangement choose the units (measured best)
                recon = recon.model_copy(update={"select": "criterion"})
        elif name == "auto":
            select = recon.resolved_select()
            nonuniform = (
                kind == "decoder"
                and self.ratio <= AUTO_OBS_MAX_RATIO
                and self.modules == "both"
                and self.head_ratio != "obs"
                and select == "obs"
            )
            if alloc == "global" or (alloc == "auto" and nonuniform):
                name = "obs"
            elif kind == "decoder" and select == "criterion":
                name = "flap"  # its scores choose the units; magnitude's wreck a decoder without a refit
            else:
                name = "magnitude"  # the counts only (uniform shares): obs selection picks the units
            if name == "obs" and self.ratio > AUTO_OBS_FREE_RATIO:
                cap = round(min(1.0, AUTO_OBS_CAP * self.ratio), 6)
                options = {"max_layer_ratio": cap, "over_cap": "last"}
        if alloc == "auto":
            alloc = parse_options(name, options).allocation()
        if (name, alloc, recon) == (self.criterion.name, self.allocation, self.reconstruction):
            return self
        criterion = CriterionConfig(name=name, options=options)
        return self.model_copy(update={"criterion": criterion, "allocation": alloc, "reconstruction": recon})

    @field_validator("ratio")
    @classmethod
    def _ratio(cls, v: float | None) -> float | None:
        if v is not None and not 0.0 < v < 1.0:
            raise ValueError(f"ratio must lie strictly between 0 and 1, got {v}")
        return v

    @field_validator("head_ratio")
    @classmethod
    def _head_ratio(cls, v: float | str) -> float | str:
        if not isinstance(v, str) and (isinstance(v, bool) or not 0.0 <= v < 1.0):
            raise ValueError(f"head_ratio must be 'auto', 'same', 'obs' or a fraction in [0, 1), got {v!r}")
        return v

    @model_validator(mode="after")
    def _vllm_needs_uniform_heads(self) -> Recipe:
        if "vllm" in self.export and self.query_heads != "uniform" and self.modules != "neurons":
            raise ValueError(
                "export vllm needs the same number of query heads in every layer (vLLM states one count for "
                "all of them): add query_heads: uniform, or prune modules: neurons"
            )
        if self.query_heads == "uniform" and self.head_ratio == "obs":
            raise ValueError(
                "query_heads uniform keeps one head count for every layer, and head_ratio obs gives each its own"
            )
        return self

    @model_validator(mode="after")
    def _obs_split_needs_obs(self) -> Recipe:
        if self.head_ratio == "obs" and self.reconstruction.resolved_select() != "obs":
            raise ValueError(
                "head_ratio 'obs' chooses each layer's split from the OBS selection's error curves: it needs "
                f"reconstruction select 'obs' (or 'auto' with method ls or liar), not {self.reconstruction.select!r} "
                f"with method {self.reconstruction.method!r}"
            )
        return self

    @field_validator("model")
    @classmethod
    def _model(cls, v: str) -> str:
        v = v.strip()
        if not v:
            raise ValueError("model must name a Hugging Face id or a local directory")
        looks_local = v.startswith((".", "/", "~")) or Path(v).expanduser().exists() or v.count("/") > 1
        if looks_local and not Path(v).expanduser().is_dir():
            raise ValueError(f"model path {v!r} does not exist or is not a directory")
        return v

    @field_validator("export", mode="before")
    @classmethod
    def _export(cls, v: Any) -> Any:
        if isinstance(v, str):  # ``export: gguf-f16`` reads as a list of one
            v = [v]
        if not isinstance(v, (list, tuple)):
            return v  # pydantic names the wrong type
        bad = [repr(x) for x in v if x not in EXPORT_FORMATS]
        if bad:
            what = f"{bad[0]} is not a serving form" if len(bad) == 1 else f"{', '.join(bad)} are not serving forms"
            raise ValueError(f"{what}; choose from {', '.join(EXPORT_FORMATS)}")
        return list(dict.fromkeys(v))  # in the order given, each once

    @field_validator("device")
    @classmethod
    def _device(cls, v: str) -> str:
        if v in ("auto", "cpu", "cuda") or (v.startswith("cuda:") and v[5:].isdigit()):
            return v
        raise ValueError(f"device must be auto, cpu, cuda or cuda:N, got {v!r}")

    # --- YAML round trip -------------------------------------------------------------------
    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json", exclude_none=True), sort_keys=False)

    @classmethod
    def from_yaml(cls, text: str) -> Recipe:
        return cls.model_validate(cls.parse_yaml(text))

    @staticmethod
    def parse_yaml(text: str) -> dict[str, Any]:
        """The mapping of a recipe's YAML text, not yet validated; ``ValueError`` for bad YAML or a
        document that is not a mapping."""
        try:
            data = yaml.safe_load(text)
        except yaml.YAMLError as exc:
            where = getattr(exc, "problem_mark", None)
            at = f" at line {where.line + 1}, column {where.column + 1}" if where is not None else ""
            problem = getattr(exc, "problem", None) or "unreadable YAML"
            raise ValueError(f"the recipe is not valid YAML{at}: {problem}") from None
        if not isinstance(data, dict):
            raise ValueError(f"a recipe must be a YAML mapping of fields, not a {type(data).__name__}")
        return data

    @classmethod
    def load(cls, path: str | Path) -> Recipe:
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"recipe file {str(path)!r} does not exist")
        return cls.from_yaml(path.read_text(encoding="utf-8"))


# the places ``activations`` may name (auto | device | recompute | host), for the scripts' choices
ACTIVATIONS: tuple[str, ...] = get_args(Recipe.model_fields["activations"].annotation)
