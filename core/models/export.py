"""Export and reload of pruned checkpoints.

A pruned checkpoint is a normal Hugging Face directory: safetensors with the original tensor names
and smaller shapes, ``config.json``, tokenizer files, plus ``recipe.yaml``, ``metrics.json`` and a
README model card. Two forms:

- *stock*: every layer has the same widths, key/value groups are equal, and any bias the
  reconstruction added can be expressed by a stock config flag (LLaMA's ``attention_bias`` /
  ``mlp_bias``, whose other projections then get zero biases). Loads with plain ``from_pretrained``.
- *liar*: per-layer widths in ``config.liar_layout`` and ``modeling_liar.py`` bundled beside the
  weights (``auto_map``), loaded with ``from_pretrained(dir, trust_remote_code=True)`` — this project
  need not be installed. ``core.load_pruned`` loads both forms without trusting remote code. Its
  ``model_type`` is the stock one, so ``AutoTokenizer.from_pretrained(dir)`` needs no remote code.

Writing goes to a temporary sibling directory renamed into place at the end, so a failed export
never leaves a half-written checkpoint.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

from torch import nn

from core.models import modeling_liar
from core.models.config_file import read_config
from core.models.liar_families import FAMILIES
from core.models.manifest import write_manifest
from core.models.modeling_liar import CLASSES, ensure_bias, get_layers
from core.models.serving_forms import (
    GGUF_FAMILIES,
    SERVED_FAMILIES,
    ExportError,
    checkpoint_form,
    gguf_architecture,
    layers_of,
)

MODELING_FILE = Path(modeling_liar.__file__)
FAMILIES_FILE = MODELING_FILE.with_name("liar_families.py")  # imported by the modeling file
_AUTO_FOR_SUFFIX = {
    "ForCausalLM": "AutoModelForCausalLM",
    "ForSequenceClassification": "AutoModelForSequenceClassification",
    "ForQuestionAnswering": "AutoModelForQuestionAnswering",
    "Model": "AutoModel",
}


def check_output_dir(path: str | Path, overwrite: bool = False) -> Path:
    """Refuse a non-empty output directory (unless ``overwrite``) before any work is done."""
    path = Path(path).expanduser()
    if path.exists() and not path.is_dir():
        raise FileExistsError(f"output {str(path)!r} exists and is not a directory")
    if path.is_dir() and any(path.iterdir()) and not overwrite:
        raise FileExistsError(f"output directory {str(path)!r} is not empty (pass overwrite to replace it)")
    if not path.parent.exists():
        raise FileNotFoundError(f"parent directory of the output {str(path.parent)!r} does not exist")
    return path


def _stock_overrides(model: nn.Module, family_name: str, layout: list[dict]) -> dict[str, Any] | None:
    """Config overrides that describe the pruned model as its stock architecture, or None."""
    fam = FAMILIES[family_name]
    first = layout[0]
    shape = lambda e: (len(e["heads"]), len(e["kv_heads"]), e["neurons"])  # noqa: E731
    if any(shape(e) != shape(first) for e in layout):
        return None
    n_heads, n_kv, n_neurons = shape(first)
    cfg = model.config
    if not fam.head_dim_in_config and n_heads != cfg.num_attention_heads:
        return None  # BERT derives head size from hidden_size / num_heads
    if fam.gqa:
        rep = cfg.num_attention_heads // (getattr(cfg, "num_key_value_heads", None) or cfg.num_attention_heads)
        for e in layout:
            groups = [sum(h // rep == kv for h in e["heads"]) for kv in e["kv_heads"]]
            if len(set(groups)) != 1:
                return None
    added = {name for e in layout for name in e["bias"]}
    overrides: dict[str, Any] = {}
    if added & {fam.o, fam.q, fam.k, fam.v}:
        if fam.attn_bias_flag is None:
            return None
        overrides[fam.attn_bias_flag] = True
    if added & {fam.ffn_out, *fam.ffn_in}:
        if fam.mlp_bias_flag is None:
            return None
        overrides[fam.mlp_bias_flag] = True
    overrides.update({"num_attention_heads": n_heads, fam.ffn_width_key: n_neurons})
    if fam.gqa:
        head_dim = getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads
        overrides.update(num_key_value_heads=n_kv, head_dim=head_dim)
    return overrides if _stock_config_loads(cfg, overrides) else None


def _stock_config_loads(cfg, overrides: dict[str, Any]) -> bool:
    """Whether the installed transformers accepts the stock config with ``overrides``: transformers 5
    refuses e.g. a LLaMA whose head count does not divide the hidden size (26 heads of 4096, what
    removing 20% of LLaMA-7B's heads leaves) even with an explicit ``head_dim``; such a model is then
    written in the ``liar_`` form, which loads."""
    data = {k: v for k, v in cfg.to_dict().items() if k not in ("liar_layout", "liar_family", "auto_map")}
    data.update(overrides)
    try:
        type(cfg).from_dict(data)
    except Exception:  # the config class's own validation: a ValueError or its wrapper
        return False
    return True


def _add_stock_biases(model: nn.Module, family_name: str, overrides: dict[str, Any]) -> None:
    fam = FAMILIES[family_name]
    paths = []
    if fam.attn_bias_flag and overrides.get(fam.attn_bias_flag):
        paths += [fam.q, fam.k, fam.v, fam.o]
    if fam.mlp_bias_flag and overrides.get(fam.mlp_bias_flag):
        paths += [*fam.ffn_in, fam.ffn_out]
    for layer in get_layers(model, fam):
        for p in paths:
            ensure_bias(layer.get_submodule(p))


def _config_dict(model: nn.Module, family_name: str, layout: list[dict]) -> tuple[dict, bool]:
    cfg = model.config.to_dict()
    overrides = _stock_overrides(model, family_name, layout)
    if overrides is not None:
        _add_stock_biases(model, family_name, overrides)
        for key in ("liar_layout", "liar_family", "auto_map"):
            cfg.pop(key, None)
        cfg.update(overrides)
        return cfg, True
    # model_type stays the stock one, so AutoConfig (which AutoTokenizer always reads first) resolves it
    # without the bundled code; the pruned classes come from auto_map / architectures
    classes = CLASSES[family_name]
    arch = type(model).__name__
    cfg["architectures"] = [f"Liar{arch}"]
    cfg["auto_map"] = {"AutoConfig": f"modeling_liar.{classes['config'].__name__}"}
    for auto, cls in classes.items():
        if auto != "config":
            cfg["auto_map"][auto] = f"modeling_liar.{cls.__name__}"
    cfg["liar_layout"], cfg["liar_family"] = layout, family_name
    return cfg, False


def model_card(result, stock: bool, architecture: str, config: dict) -> str:
    """The README of a checkpoint whose ``config.json`` holds ``config``."""
    r = result.recipe
    load = (
        "from transformers import {auto}, AutoTokenizer\n"
        'model = {auto}.from_pretrained("PATH"{trust})\n'
        'tokenizer = AutoTokenizer.from_pretrained("PATH")'
    ).format(
        auto=_auto_name(architecture),
        trust="" if stock else ", trust_remote_code=True",
    )
    rows = "\n".join(
        f"| {x.layer} | {x.module} | {x.kept}/{x.total} | {x.error_before:.4f} | {x.error_after:.4f} |"
        for x in result.report
    )
    metrics = "\n".join(f"| {k} | {v} |" for k, v in result.summary().items())
    return f"""---
library_name: transformers
tags: [pruned, structured-pruning, liar]
base_model: {r.model}
---
# {Path(r.model).name} — structurally pruned ({r.ratio:.0%} of block parameters, {r.reconstruction.method})

Pruned from `{r.model}` without retraining: criterion `{r.criterion.name}`, modules `{r.modules}`,
allocation `{r.allocation}`, reconstruction `{r.reconstruction.method}` (damping {r.reconstruction.damp}),
calibrated on {r.calibration.num_calibration_samples} × {r.calibration.max_seq_length} tokens of
`{r.calibration.dataset or "inline texts"}` (seed {r.calibration.seed}).
{
        "Stock architecture: loads with plain `from_pretrained`."
        if stock
        else "Layers have different widths: the bundled `modeling_liar.py` builds them (`trust_remote_code=True`)."
    }

```python
{load}
```

## Serving
{_serving(stock, architecture)}
{_serving_forms(result.adapter.name, config)}

## Metrics
| metric | value |
|---|---|
{metrics}

## Per-layer reconstruction error
Relative output error ‖XW+B − (X_uW'+B')‖²/‖XW+B‖² of each pruned projection, before (plain pruning) and
after reconstruction, measured on {result.report[0].measured_on if result.report else "held-aside"} calibration tokens.

| layer | module | kept | error before | error after |
|---|---|---|---|---|
{rows}

The full recipe is in `recipe.yaml`; all numbers in `metrics.json`.
"""


def _serving(stock: bool, architecture: str) -> str:
    """How to serve the checkpoint: a stock one like its original, a ``liar_`` one in transformers only."""
    if stock:
        return f"""A stock `{architecture}` checkpoint: `config.json` states every width a serving engine reads
(`num_attention_heads`, `num_key_value_heads` and `head_dim` where the architecture has them, the FFN
width), the same for every layer, and there is no custom code. Serve it as the original model:
`transformers` without `trust_remote_code`, or an engine that supports the architecture, e.g.
`vllm serve PATH` (vLLM) or `--model-id PATH` (Text Generation Inference); the project checks the
`transformers` load, not the engines."""
    return """Not a stock architecture: layers have different widths, or a layer's kept query heads form key/value
groups of unequal size (served by a key/value index). `config.json` carries the per-layer widths in
`liar_layout` and the bundled `modeling_liar.py` builds them, so it loads in `transformers` with
`trust_remote_code=True`; serving engines read other forms of it (below).
For a stock checkpoint, prune with `allocation: uniform` and `round_to: {kv_groups: whole}` (every layer
a stock grouped-query attention), with FFN widths that come out equal in every layer (`round_to:
{neurons: 1}` does; a coarser multiple may leave neighbouring multiples in different layers)."""


# what llama.cpp's architecture of each kind states, said on the card of a checkpoint written as it
_GGUF_ARCHITECTURE = {
    "llama": "llama.cpp's `llama` architecture (the same widths in every layer)",
    "deci": "llama.cpp's `deci` architecture (per-layer arrays state every layer's widths)",
    "phi3": "llama.cpp's own `phi3` architecture",
}


def _gguf_form(family_name: str, config: dict) -> str:
    """The card's GGUF paragraph: the llama.cpp architecture the checkpoint is written as, or why none."""
    layers, head_dim = layers_of(config)
    params = config.get("rope_parameters") or {}
    factor = float(params.get("partial_rotary_factor", config.get("partial_rotary_factor")) or 1.0)
    form = checkpoint_form(config, layers, head_dim)
    try:
        arch = gguf_architecture(family_name, form, int(head_dim * factor), head_dim)
    except ExportError as exc:
        return f"**llama.cpp / ollama:** this checkpoint has no GGUF form: {exc}.\n"
    own = f"llama.cpp's own `{arch}` architecture (one width for every layer, no bias added)"
    what = _GGUF_ARCHITECTURE.get(arch, own)
    return f"""**llama.cpp / ollama:** `liar export PATH --format gguf --quant q4_k_m` (or `f16`, `q8_0`) writes
`PATH/NAME-q4_k_m.gguf`, one file with the tokenizer inside, as {what}, which stock llama.cpp runs:
`llama-cli -m FILE`.
"""


_VLLM_FORM = """
**vLLM:** `liar export PATH --format vllm` writes `PATH/vllm/` in vLLM's DeciLM form (per-layer
key/value heads and FFN widths; every layer must keep the same number of query heads, which a
recipe with `query_heads: uniform` guarantees): `vllm serve PATH/vllm --trust-remote-code`.
"""


def _serving_forms(family_name: str, config: dict) -> str:
    """How to get the checkpoint's engine forms (``core.serving`` writes GGUF for ``GGUF_FAMILIES``, as the
    architecture ``gguf_architecture`` decides, and vLLM's DeciLM form for ``SERVED_FAMILIES`` only), and
    the list of those already written (filled in by ``core.serving.card``)."""
    if family_name not in GGUF_FAMILIES:
        return ""
    vllm = _VLLM_FORM if family_name in SERVED_FAMILIES else ""
    return f"""
{_gguf_form(family_name, config)}{vllm}
The serving files written so far (a recipe's `export` writes them with the checkpoint):
<!-- gguf-files -->
<!-- /gguf-files -->
"""


def _auto_name(name: str) -> str:
    for suffix, auto in _AUTO_FOR_SUFFIX.items():
        if name.endswith(suffix):
            return auto
    return "AutoModel"


def write_config(model: nn.Module, family_name: str, layout: list[dict], directory: Path) -> bool:
    """Write ``config.json`` (and the bundled code for the ``liar_`` form); returns whether the
    stock form was chosen (which may add zero biases to ``model``, see :func:`_add_stock_biases`)."""
    cfg, stock = _config_dict(model, family_name, layout)
    (directory / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
    if not stock:
        shutil.copyfile(MODELING_FILE, directory / MODELING_FILE.name)
        shutil.copyfile(FAMILIES_FILE, directory / FAMILIES_FILE.name)
    return stock


def finish_checkpoint(result, directory: Path, out: Path, stock: bool, digests: dict[str, str] | None = None) -> Path:
    """Add the metrics, the model card and ``SHA256SUMS`` to a written checkpoint in ``directory``
    and move it to ``out`` (replacing what is there)."""
    metrics = {**result.summary(), "stock_architecture": stock, "layers": result.layer_rows()}
    (directory / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    config = read_config(directory)
    architecture = (config.get("architectures") or [""])[0]
    (directory / "README.md").write_text(model_card(result, stock, architecture, config))
    write_manifest(directory, digests)
    if out.exists():
        shutil.rmtree(out)
    os.replace(directory, out)
    return out


def save_pruned(result, output_dir: str | Path, overwrite: bool = False) -> Path:
    out = check_output_dir(output_dir, overwrite)
    layout = result.model.config.liar_layout
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    try:
        tmp.mkdir()
        stock = write_config(result.model, result.adapter.name, layout, tmp)
        config_text = (tmp / "config.json").read_text()
        result.model.save_pretrained(tmp, safe_serialization=True, max_shard_size="2GB")
        (tmp / "config.json").write_text(config_text)  # save_pretrained wrote the model's own
        if result.tokenizer is not None:
            result.tokenizer.save_pretrained(tmp)
        (tmp / "recipe.yaml").write_text(result.recipe.to_yaml())
        return finish_checkpoint(result, tmp, out, stock)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
