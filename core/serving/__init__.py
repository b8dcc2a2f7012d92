"""After the prune: a checkpoint in the forms serving engines run.

``FORMATS`` names every form ``export`` writes; recipes, jobs, the CLI and the web form offer these
names. ``preflight`` checks, before any pruning, that a model can be written in the asked forms (its
family, rotary scaling and tokenizer; the engine a quantized form needs; given the recipe, that the
checkpoint it prunes has a GGUF architecture: ``gguf_recipe``), so a late failure never costs a
finished prune. ``check_recipe`` is that last part alone, for the cells of a grid.
"""

from __future__ import annotations

from pathlib import Path

from core.serving.forms import GGUF_FORMATS, Written, write_form
from core.serving.gguf_export import ExportError, check_exportable, plan, verify_checkpoint
from core.serving.gguf_recipe import check_recipe_gguf
from core.serving.imatrix import NEEDS_IMATRIX
from core.serving.quantize import QUANTIZED, Matrices
from core.spec.recipe import EXPORT_FORMATS, Recipe

# form name → GGUF weight type (GGUF_FORMATS); "vllm": vLLM's DeciLM form in the checkpoint's ``vllm/`` folder
FORMATS = EXPORT_FORMATS  # the names live in core.spec, which recipes validate with (torch-free)


def _unknown(names: list[str]) -> None:
    bad = [n for n in names if n not in FORMATS]
    if bad:
        raise ExportError(f"unknown export form {', '.join(map(repr, bad))}: the forms are {', '.join(FORMATS)}")


def preflight(model_dir: str | Path, formats: list[str], engines: bool = True, recipe: Recipe | None = None) -> None:
    """``ExportError`` when the model in ``model_dir`` (pruned or not) cannot be written in ``formats``;
    ``engines``: also that the engines a form needs are here (off where the run happens elsewhere);
    ``recipe``: also that the checkpoint it prunes from the model can be (:func:`check_recipe`)."""
    from core.models.config_file import read_config
    from core.serving.engines import INSTALL_HINT, llama_cpp_python
    from core.serving.vllm_form import check_vllm_family

    _unknown(formats)
    directory = Path(model_dir).expanduser()
    if any(f in GGUF_FORMATS for f in formats):
        ready = check_exportable(directory)
        if recipe is not None:
            check_recipe_gguf(ready.plan, recipe)
    if "vllm" in formats:
        check_vllm_family(read_config(directory))
    quantized = [f for f in formats if GGUF_FORMATS.get(f) in QUANTIZED]
    if engines and quantized and llama_cpp_python() is None:
        raise ExportError(f"{quantized[0]} needs llama.cpp's quantizer, which this machine lacks: {INSTALL_HINT}")
    weighted = [f for f in formats if GGUF_FORMATS.get(f) in NEEDS_IMATRIX]
    if weighted and not _has_calibration(directory) and recipe is None:
        raise ExportError(
            f"{weighted[0]} needs an importance matrix, gathered over the checkpoint's calibration text, and "
            f"{directory.name} names none (no recipe.yaml with a calibration set)"
        )


def _has_calibration(directory: Path) -> bool:
    """Whether the checkpoint names the calibration set an importance matrix is gathered over (whether it
    can be read here is the gathering's to say: a server's job names its texts as users do)."""
    from core.serving.quantize import recipe_calibration

    return recipe_calibration(directory) is not None


def preflight_model(
    model: str, formats: list[str], engines: bool = True, download: bool = True, recipe: Recipe | None = None
) -> None:
    """:func:`preflight` for a recipe's model: a local folder, or (``download``) a hub model fetched as
    the streamed prune fetches it, into the same cache. A model whose files cannot be had is left to the
    prune, which says why."""
    from core.models.streaming import checkpoint_directory

    if not formats or not (download or Path(model).expanduser().is_dir()):
        return
    directory = checkpoint_directory(model)
    if directory is not None:
        preflight(directory, formats, engines=engines, recipe=recipe)


def check_recipe(recipe: Recipe) -> None:
    """``ExportError`` when the GGUF forms ``recipe`` asks for cannot be written from the checkpoint it
    prunes (``gguf_recipe``: a family whose llama.cpp architecture states one width for every layer and no
    added bias, pruned by a recipe that gives either). Reads the model's config only, not its tokenizer or
    weights: for the cells of a grid whose model :func:`preflight` checked once. A local folder only (a hub
    model is checked by the worker, with the whole of :func:`preflight`)."""
    directory = Path(recipe.model).expanduser()
    if any(f in GGUF_FORMATS for f in recipe.export) and (directory / "config.json").is_file():
        check_recipe_gguf(plan(directory), recipe)


def export(checkpoint: str | Path, formats: list[str], threads: int = 2, log=print) -> list[Path]:
    """Write each of ``formats`` inside ``checkpoint`` (listed in its card and ``SHA256SUMS``:
    :func:`write_form`); the weights are checked against ``SHA256SUMS`` once, before the first. The
    quantized GGUF forms are weighted by one importance matrix, gathered from the checkpoint's
    calibration text where it can be read (``quantize.Matrices``); ``log`` gets a line on that and on
    each tensor that fell back from its K-quant type."""
    _unknown(formats)
    checkpoint = Path(checkpoint).expanduser()
    if formats:
        verify_checkpoint(checkpoint)
    matrices = Matrices(checkpoint)
    return [write_form(checkpoint, f, threads=threads, log=log, matrices=matrices).path for f in formats]


__all__ = [
    "FORMATS",
    "GGUF_FORMATS",
    "ExportError",
    "Matrices",
    "Written",
    "check_recipe",
    "export",
    "preflight",
    "preflight_model",
    "write_form",
]
