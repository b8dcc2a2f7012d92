"""Loading a model and its tokenizer from a Hugging Face id or a local directory, onto a device."""

from __future__ import annotations

from pathlib import Path

import torch

from core.models import modeling_liar
from core.models.adapter import adapter_for
from core.models.config_file import read_config
from core.models.liar_families import PRUNED_PREFIX, family_of


def ensure_pad_token(tokenizer) -> None:
    """Pad with the end-of-sequence token when a tokenizer has no pad token (LLaMA-family tokenizers)."""
    if tokenizer is not None and tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} was asked for but CUDA is not available on this machine")
    return torch.device(device)


def resolve_dtype(dtype: str, config, device: torch.device) -> torch.dtype:
    if dtype != "auto":
        return getattr(torch, dtype)
    if device.type == "cpu":
        return torch.float32  # half precision matmuls are slow and inexact on CPUs
    get = config.get if isinstance(config, dict) else lambda key: getattr(config, key, None)
    stored = get("dtype") or get("torch_dtype")
    if isinstance(stored, str):
        stored = getattr(torch, stored, None)
    return stored if stored in (torch.float16, torch.bfloat16) else torch.float32


def model_class(config, kind: str):
    import transformers

    archs = getattr(config, "architectures", None) or []
    for arch in archs:
        if kind == "encoder" and "ForSequenceClassification" in arch:
            return transformers.AutoModelForSequenceClassification
        if kind == "encoder" and "ForQuestionAnswering" in arch:
            return transformers.AutoModelForQuestionAnswering
    return transformers.AutoModelForCausalLM if kind == "decoder" else transformers.AutoModel


def load_model(name: str, dtype: str = "auto", device: str = "auto"):
    """Load ``(model, tokenizer, adapter)`` from a hub id or a local directory, in eval mode."""
    from transformers import AutoConfig, AutoTokenizer

    local = Path(name).expanduser()
    src = str(local) if local.is_dir() else name
    if (local / "config.json").is_file():
        if is_pruned_config(read_config(local)):
            dev = resolve_device(device)
            model, tokenizer = load_pruned(local, dtype=None if dtype == "auto" else getattr(torch, dtype), device=dev)
            if dev.type == "cpu" and dtype == "auto":
                model = model.float()
            return model, tokenizer, adapter_for(model)
    try:
        config = AutoConfig.from_pretrained(src)
    except Exception as exc:
        raise RuntimeError(
            f"could not load the model config of {name!r} ({type(exc).__name__}: {exc}). Give a local "
            "directory with config.json, or a Hugging Face id reachable from this machine."
        ) from exc
    adapter = adapter_for(config)
    dev = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, config, dev)
    model = model_class(config, adapter.kind).from_pretrained(src, dtype=torch_dtype).to(dev).eval()
    try:
        tokenizer = AutoTokenizer.from_pretrained(src)
    except Exception as exc:
        raise RuntimeError(f"could not load a tokenizer for {name!r}: {exc}") from exc
    ensure_pad_token(tokenizer)
    return model, tokenizer, adapter


def is_pruned_config(raw: dict) -> bool:
    """Whether a raw ``config.json`` is a ``liar_`` checkpoint's (per-layer widths in ``liar_layout``;
    its ``model_type`` is the stock one, or ``liar_<family>`` in checkpoints written before)."""
    return raw.get("liar_layout") is not None or str(raw.get("model_type", "")).startswith(PRUNED_PREFIX)


def pruned_classes(raw: dict, cfg_file: Path) -> tuple[type, type]:
    """``(config class, model class)`` of a ``liar_`` checkpoint's raw config (from the bundled
    classes of this project's copy of ``modeling_liar``)."""
    if raw.get("liar_family") not in modeling_liar.CLASSES:
        raise ValueError(f"unknown pruned model family {raw.get('liar_family')!r} in {cfg_file}")
    classes = modeling_liar.CLASSES[raw["liar_family"]]
    arch = (raw.get("architectures") or [""])[0]
    cls = next((c for k, c in classes.items() if k != "config" and c.__name__ == arch), None)
    if cls is None:
        raise ValueError(f"unknown pruned architecture {arch!r} in {cfg_file}")
    return classes["config"], cls


def load_pruned(path: str | Path, dtype: torch.dtype | None = None, device: str | torch.device = "cpu"):
    """Load a checkpoint written by :func:`save_pruned` (either form) → ``(model, tokenizer)``."""
    from transformers import AutoConfig, AutoTokenizer

    path = Path(path).expanduser()
    cfg_file = path / "config.json"
    if not cfg_file.is_file():
        raise FileNotFoundError(f"{str(path)!r} is not a model directory (no config.json)")
    raw = read_config(path)
    kwargs = {} if dtype is None else {"dtype": dtype}
    if is_pruned_config(raw):
        model = pruned_classes(raw, cfg_file)[1].from_pretrained(path, **kwargs)
    else:
        config = AutoConfig.from_pretrained(path)
        family = family_of(config.model_type)
        if family is None:
            raise ValueError(f"model type {config.model_type!r} in {cfg_file} is not supported")
        model = model_class(config, family.kind).from_pretrained(path, **kwargs)
    model = model.to(device).eval()
    tokenizer = None
    if any((path / f).exists() for f in ("tokenizer.json", "tokenizer_config.json", "vocab.txt")):
        # pass the loaded config: AutoTokenizer would otherwise re-read config.json and ask whether to
        # trust the bundled code, which this project's own copy makes unnecessary
        tokenizer = AutoTokenizer.from_pretrained(path, config=model.config)
        ensure_pad_token(tokenizer)
    return model, tokenizer
