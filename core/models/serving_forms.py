"""Which serving forms a checkpoint of each family has, and which llama.cpp architecture its GGUF file is.

One decision, :func:`gguf_architecture`, used by the GGUF writer (``core.serving.gguf_export``), by the
check of a recipe before any pruning (``core.serving.preflight``) and by the model card
(``core.models.export``), so none of them can pass a checkpoint another refuses:

- LLaMA, Mistral and Qwen2 (``SERVED_FAMILIES``, also vLLM's DeciLM form): ``llama`` when every layer has
  the same widths and its kept query heads form equal groups in checkpoint order (never Qwen2: llama.cpp's
  ``qwen2`` wants the full head count and no bias on the attention output), otherwise ``deci``, whose
  per-layer arrays state any pruned layout, biases included.
- Qwen3, Gemma 2 and Gemma 3 text (``OWN_ARCHITECTURE``): their own llama.cpp architecture, which states one
  number of query heads, key/value heads and FFN width for all layers and has no bias on the attention
  output or the FFN down projection. Anything else is refused, naming the recipe settings that give a
  checkpoint it states.
- Phi-3: llama.cpp's ``phi3`` while every query head is kept (it derives the head size from the hidden
  size), the widths are the same in every layer and no bias was added; otherwise the same computation as
  LLaMA's, through ``llama``/``deci``, which rotate every channel of a head.

Torch-free: the layer shapes come from the config alone.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

SERVED_FAMILIES = ("llama", "mistral", "qwen2")  # GGUF through llama/deci, and vLLM's DeciLM form
OWN_ARCHITECTURE = ("qwen3", "gemma2", "gemma3")  # GGUF as llama.cpp's model of the same name, uniform only
GGUF_FAMILIES = (*SERVED_FAMILIES, *OWN_ARCHITECTURE, "phi3")
SHARED = ("llama", "deci")  # the architectures of LLaMA's computation

# what gives a checkpoint one width in every layer, and one without added biases: the reconstruction
# methods that add none (the others put B' = B + μ_m W_m on the attention output and the FFN's down
# projection, core.stats.reconstruct)
UNIFORM_RECIPE = "allocation: uniform, round_to.kv_groups: whole, round_to.neurons: 1"
BIAS_FREE_METHODS = ("none", "mask_tuning")
NO_BIAS_RECIPE = f"reconstruction.method {' or '.join(BIAS_FREE_METHODS)}"


class ExportError(ValueError):
    """The checkpoint cannot be written in a serving form (the message says why and what would work)."""


@dataclass(frozen=True)
class LayerShape:
    """One block as an engine's attention sees it."""

    q_heads: list[int]  # the checkpoint's query heads (positions in q_proj), in the engine's order
    kv_rows: list[int]  # for each of the engine's key/value heads, its position in the checkpoint's k/v
    n_ff: int

    @property
    def n_head(self) -> int:
        return len(self.q_heads)

    @property
    def n_kv(self) -> int:
        return len(self.kv_rows)


def layer_shape(entry: dict, n_heads: int, n_kv: int) -> LayerShape:
    """The engine's view of a layer keeping query heads ``entry['heads']`` over key/value heads
    ``entry['kv_heads']`` (original indices; ``n_heads`` over ``n_kv`` in the unpruned model)."""
    heads, kv_heads, rep = list(entry["heads"]), list(entry["kv_heads"]), n_heads // n_kv
    position = {kv: i for i, kv in enumerate(kv_heads)}
    reads = [position[h // rep] for h in heads]  # each kept query head's key/value head (checkpoint position)
    order = sorted(range(len(heads)), key=lambda i: reads[i])  # stable: groups become contiguous
    sizes = [reads.count(j) for j in range(len(kv_heads)) if reads.count(j)]
    group = math.gcd(*sizes)
    kv_rows = [j for j in range(len(kv_heads)) for _ in range(reads.count(j) // group)]
    return LayerShape(q_heads=order, kv_rows=kv_rows, n_ff=int(entry["neurons"]))


def layers_of(config: dict) -> tuple[list[LayerShape], int]:
    """Every block of a checkpoint (``liar_layout`` or, for a stock one, the config's widths) and the
    head size."""
    n_heads = config["num_attention_heads"]
    n_kv = config.get("num_key_value_heads") or n_heads
    head_dim = config.get("head_dim") or config["hidden_size"] // n_heads
    layout = config.get("liar_layout")
    if layout is None:
        full = {"heads": list(range(n_heads)), "kv_heads": list(range(n_kv)), "neurons": config["intermediate_size"]}
        layout = [full] * config["num_hidden_layers"]
    return [layer_shape(e, n_heads, n_kv) for e in layout], head_dim


@dataclass(frozen=True)
class Form:
    """What decides a checkpoint's GGUF architecture: of a written checkpoint, or of the one a recipe will
    write. Each of ``widths``, ``bias``, ``heads`` is None when it holds, else (what the checkpoint has,
    the recipe settings that avoid it)."""

    widths: tuple[str, str] | None  # layers of different widths (query heads, key/value heads, FFN)
    bias: tuple[str, str] | None  # a bias on the attention output or the FFN
    heads: tuple[str, str] | None  # query heads removed (llama.cpp's phi3 needs them all)
    regrouped: bool = False  # some layer's query heads reordered or its key/value heads repeated: deci
    subject: str = "this checkpoint has"  # how the message names the checkpoint
    verb: str = "re-prune with"


def checkpoint_form(config: dict, layers: list[LayerShape], head_dim: int) -> Form:
    """The form of a written checkpoint (its config and layer shapes)."""
    first = layers[0]
    uniform = all((x.n_head, x.n_kv, x.n_ff) == (first.n_head, first.n_kv, first.n_ff) for x in layers)
    regrouped = any(x.q_heads != sorted(x.q_heads) or len(set(x.kv_rows)) != x.n_kv for x in layers)
    layout = config.get("liar_layout") or []
    biased = bool(config.get("attention_bias") or config.get("mlp_bias") or any(e.get("bias") for e in layout))
    # every query head kept, as llama.cpp's phi3 reads it: it derives the head size from the hidden size
    all_heads = all(x.n_head * head_dim == config["hidden_size"] for x in layers)
    return Form(
        widths=None if uniform else ("layers of different widths", UNIFORM_RECIPE),
        bias=("the biases its reconstruction added", NO_BIAS_RECIPE) if biased else None,
        heads=None if all_heads else ("query heads removed", "modules: neurons"),
        regrouped=regrouped,
    )


def _listed(items: list[str]) -> str:
    return items[0] if len(items) == 1 else f"{', '.join(items[:-1])} and {items[-1]}"


def gguf_architecture(family: str, form: Form, n_rot: int, head_dim: int) -> str:
    """The llama.cpp architecture a checkpoint of ``family`` in ``form`` is written as (``n_rot`` of its
    ``head_dim`` channels rotated); ``ExportError`` naming what would work when there is none."""
    shared = "llama" if family != "qwen2" and form.widths is None and not form.regrouped else "deci"
    if family in SERVED_FAMILIES:
        return shared
    if family in OWN_ARCHITECTURE:
        wrong = [p for p in (form.widths, form.bias) if p is not None]
        if wrong:
            raise ExportError(
                f"llama.cpp's {family} architecture has one number of query heads, key/value heads and FFN width "
                f"for all layers and no bias on the attention output or the FFN; {form.subject} "
                f"{_listed([w for w, _ in wrong])}: {form.verb} {_listed([f for _, f in wrong])}"
            )
        return family
    if family != "phi3":
        raise ExportError(f"GGUF export has no architecture for the {family} family")
    wrong = [p for p in (form.heads, form.widths, form.bias) if p is not None]
    if not wrong:
        return "phi3"
    if n_rot != head_dim:  # LLaMA's computation, which rotates every channel
        raise ExportError(
            "llama.cpp's phi3 architecture needs every query head, one width for all layers and no added bias, "
            f"and its llama and deci ones, which take any other Phi-3, rotate every channel of a head while this "
            f"model rotates {n_rot} of {head_dim}; {form.subject} {_listed([w for w, _ in wrong])}: {form.verb} "
            f"{_listed([f for _, f in wrong])}"
        )
    return shared
