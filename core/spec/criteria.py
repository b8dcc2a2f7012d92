"""What each pruning criterion accepts, as data: its options schema and the recipe settings it needs.

The scoring code lives in :mod:`core.criteria` (torch); this module is what a recipe is validated
against, so a form check in the web process never imports torch. Each criterion's options are a
pydantic model; ``check_recipe`` states the cross-field rules (modules, allocation) the criterion
needs. A recipe keeps ``criterion.options`` as a plain mapping (the YAML users write), validated here.

Example (options of LLM-Pruner's Taylor criterion)::

    criterion:
      name: taylor
      options: {taylor: param_mix, aggregation: sum, mlp_layers: [3, 30], samples: 64}
"""

from __future__ import annotations

from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator

FLAP_METRICS = ("IFV", "WIFV", "WIFN")
FLAP_STRUCTURES = ("UL-UM", "AL-AM")
TAYLOR_MODES = ("param_first", "param_second", "param_mix", "vectorize")
TAYLOR_AGGREGATIONS = ("sum", "prod", "max", "last")
KCM_COMBINE = ("product", "rank")
OBS_NORMALIZE = ("residual", "none")
OBS_OVER_CAP = ("never", "last")


class CriterionOptions(BaseModel):
    """Options of a criterion without any; subclasses add fields and rules."""

    model_config = ConfigDict(frozen=True)
    name: ClassVar[str] = ""

    @model_validator(mode="before")
    @classmethod
    def _no_unknown(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            raise ValueError(f"criterion {cls.name!r}: options must be a mapping, got {type(data).__name__}")
        unknown = set(data) - set(cls.model_fields)
        if unknown:
            raise ValueError(
                f"criterion {cls.name!r} has no option(s) {sorted(unknown)}; "
                f"allowed: {sorted(cls.model_fields) or 'none'}"
            )
        return data

    def check_recipe(self, modules: str, allocation: str) -> None:
        """Raise ``ValueError`` when the recipe's modules / allocation do not suit this criterion."""

    def allocation(self) -> str:
        """What ``allocation: auto`` means with this criterion: the one it needs, else uniform."""
        return "uniform"


def _choice(value: Any, allowed: tuple[str, ...], what: str) -> Any:
    if value not in allowed:
        raise ValueError(f"unknown {what} {value!r}; choose one of {allowed}")
    return value


def _positive(value: Any, what: str) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
        raise ValueError(f"{what} must be a positive number, got {value!r}")
    return value


class MagnitudeOptions(CriterionOptions):
    name: ClassVar[str] = "magnitude"


class RandomOptions(CriterionOptions):
    name: ClassVar[str] = "random"
    seed: int = 0


class FlapOptions(CriterionOptions):
    name: ClassVar[str] = "flap"
    metric: str = "WIFV"
    structure: str = "UL-UM"

    @model_validator(mode="after")
    def _choices(self) -> FlapOptions:
        _choice(self.metric, FLAP_METRICS, "FLAP metric")
        _choice(self.structure, FLAP_STRUCTURES, "FLAP structure")
        return self

    def allocation(self) -> str:
        return "global" if self.structure == "AL-AM" else "uniform"

    def check_recipe(self, modules: str, allocation: str) -> None:
        need = self.allocation()
        if allocation != need:
            raise ValueError(
                f"FLAP structure {self.structure} allocates {'across layers' if need == 'global' else 'per layer'}: "
                f"set allocation: {need} (got {allocation})"
            )


class GradientOptions(CriterionOptions):
    """Options shared by the criteria that back-propagate the calibration loss."""

    samples: Any = None  # calibration samples used for the gradients (default: all)
    checkpointing: Any = False  # recompute each block in the backward pass to save memory

    @model_validator(mode="after")
    def _gradient_fields(self) -> GradientOptions:
        s = self.samples
        if s is not None and (isinstance(s, bool) or not isinstance(s, int) or s < 1):
            raise ValueError(
                f"{self.name}: samples must be a positive integer (calibration samples used for gradients)"
            )
        if not isinstance(self.checkpointing, bool):
            raise ValueError(f"{self.name}: checkpointing must be true or false")
        return self


class SnipOptions(GradientOptions):
    name: ClassVar[str] = "snip"


class KwonOptions(GradientOptions):
    name: ClassVar[str] = "kwon"
    rearrange: Any = True  # re-choose each layer's kept set with its block-diagonal Fisher matrix

    @model_validator(mode="after")
    def _flag(self) -> KwonOptions:
        if not isinstance(self.rearrange, bool):
            raise ValueError("kwon: rearrange must be true or false")
        return self


def layer_span(span: Any, key: str, n_layers: int | None = None) -> range | None:
    """``[start, end)`` layer indices as a range (None: all layers, or unknown ``n_layers``)."""
    if span is None:
        return None if n_layers is None else range(n_layers)
    if (
        not isinstance(span, (list, tuple))
        or len(span) != 2
        or not all(isinstance(v, int) and not isinstance(v, bool) for v in span)
        or not 0 <= span[0] < span[1]
    ):
        raise ValueError(f"taylor: {key} must be [start, end) layer indices with 0 <= start < end, got {span!r}")
    if n_layers is not None and span[1] > n_layers:
        raise ValueError(f"taylor: {key} {list(span)} reaches past the model's {n_layers} layers")
    return range(span[0], span[1])


class TaylorOptions(GradientOptions):
    name: ClassVar[str] = "taylor"
    taylor: str = "param_first"
    aggregation: str = "sum"
    attention_layers: Any = None  # [start, end): only these layers lose heads
    mlp_layers: Any = None  # [start, end): only these layers lose neurons

    @model_validator(mode="after")
    def _choices(self) -> TaylorOptions:
        _choice(self.taylor, TAYLOR_MODES, "taylor mode")
        _choice(self.aggregation, TAYLOR_AGGREGATIONS, "taylor aggregation")
        layer_span(self.attention_layers, "attention_layers")
        layer_span(self.mlp_layers, "mlp_layers")
        return self

    @property
    def second_order(self) -> bool:
        return self.taylor in ("param_second", "param_mix")


class KcmOptions(CriterionOptions):
    name: ClassVar[str] = "kcm"
    sigma: Any = 1.0  # Gaussian kernel width
    alpha: Any = 0.01  # stopping rate of the multiplicative update
    combine: str = "product"
    max_iter: int = 1000

    @model_validator(mode="after")
    def _values(self) -> KcmOptions:
        _positive(self.sigma, "kcm: sigma")
        _positive(self.alpha, "kcm: alpha")
        _choice(self.combine, KCM_COMBINE, "kcm combine")
        return self

    def check_recipe(self, modules: str, allocation: str) -> None:
        if modules != "neurons":
            raise ValueError(f"KCM scores FFN neurons only: set modules: neurons (got {modules})")


class ObsOptions(CriterionOptions):
    """Options of ``obs``: units scored by the output error they leave behind (see core/criteria/obs.py)."""

    name: ClassVar[str] = "obs"
    max_layer_ratio: Any = None  # at most this fraction of a layer's heads and of its neurons go (None: no cap)
    # units past the cap: never go (the ratio may then be out of reach), or go last, only when the
    # units within every layer's cap cannot reach the ratio (the default's cap: any model can be pruned)
    over_cap: str = "never"
    normalize: str = "residual"  # errors over the residual stream's energy entering the block | "none"
    # neurons removed per round of a layer's greedy path; auto: 32, more for an FFN wider than
    # 64 × 32 = 2,048 neurons, so that no path takes more than 64 rounds (core/criteria/obs.path_step)
    step: Any = "auto"

    @model_validator(mode="after")
    def _values(self) -> ObsOptions:
        cap = self.max_layer_ratio
        if cap is not None and (isinstance(cap, bool) or not isinstance(cap, (int, float)) or not 0 < cap <= 1):
            raise ValueError(f"obs: max_layer_ratio must be a fraction in (0, 1] or null, got {cap!r}")
        _choice(self.normalize, OBS_NORMALIZE, "obs normalize")
        _choice(self.over_cap, OBS_OVER_CAP, "obs over_cap")
        if self.step != "auto" and (isinstance(self.step, bool) or not isinstance(self.step, int) or self.step < 1):
            raise ValueError(f"obs: step must be 'auto' or a positive integer, got {self.step!r}")
        return self

    def allocation(self) -> str:
        return "global"

    def check_recipe(self, modules: str, allocation: str) -> None:
        if allocation != "global":
            raise ValueError(
                "criterion obs decides how many units each layer loses by ranking them across layers: "
                f"set allocation: global (got {allocation})"
            )


CRITERION_OPTIONS: dict[str, type[CriterionOptions]] = {
    cls.name: cls
    for cls in (
        MagnitudeOptions,
        FlapOptions,
        SnipOptions,
        KwonOptions,
        TaylorOptions,
        KcmOptions,
        ObsOptions,
        RandomOptions,
    )
}
CRITERIA = tuple(CRITERION_OPTIONS)  # in the order the web form lists them
# criteria that back-propagate through the whole model: they cannot run one block at a time
WHOLE_MODEL_GRADIENTS = tuple(n for n, c in CRITERION_OPTIONS.items() if issubclass(c, GradientOptions))


def streaming_refusal(name: str) -> str | None:
    """Why criterion ``name`` cannot run streamed, or None when it can (``auto`` always can)."""
    if name not in WHOLE_MODEL_GRADIENTS:
        return None
    ok = ", ".join(n for n in CRITERIA if n not in WHOLE_MODEL_GRADIENTS)
    return (
        f"criterion {name!r} needs gradients of the whole model, which streamed execution cannot compute "
        f"block by block; use execution: memory (the model must fit on the device) or one of {ok}"
    )


def parse_options(name: str, options: dict[str, Any], modules: str | None = None, allocation: str | None = None):
    """Validate ``options`` of criterion ``name`` (and, when given, its fit with modules / allocation)."""
    if name not in CRITERION_OPTIONS:
        raise ValueError(f"unknown criterion {name!r}; choose one of {sorted(CRITERION_OPTIONS)}")
    try:
        parsed = CRITERION_OPTIONS[name].model_validate(dict(options) if isinstance(options, dict) else options)
    except ValidationError as exc:  # one plain sentence, not pydantic's report
        raise ValueError(exc.errors()[0]["msg"].removeprefix("Value error, ")) from None
    if modules is not None and allocation is not None:
        parsed.check_recipe(modules, parsed.allocation() if allocation == "auto" else allocation)
    return parsed
