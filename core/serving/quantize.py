"""llama.cpp's quantized GGUF types: which the export offers, which need an importance matrix, the
matrix a checkpoint's own calibration text gives (``core.serving.imatrix``), and what the quantizer
did with each tensor.

K-quants (``q*_k_m``) and i-quants pack a row in blocks of 256 values; a tensor whose rows are not a
multiple of 256 long (``ne0``: the input width; for ``attn_output`` the kept query heads × head_dim,
for ``ffn_down`` the kept FFN neurons) falls back to a legacy 32-value type (Q4_0 … Q8_0) or to f16:
a larger file, often slower. :func:`tensor_types` reads the types back from the file and
:func:`fallbacks` names the tensors that fell back; ``round_to.k_quant`` prunes so they do not.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import numpy as np
import torch

from core.serving.card import IMATRIX
from core.serving.imatrix import IMATRIX_HINT, NEEDS_IMATRIX, Imatrix, StatsReader, input_sums
from core.serving.layout import ExportError
from core.spec.recipe import GGUF_TYPES

# the types llama.cpp's quantizer writes here (f32 / f16 are written by the export itself)
QUANTIZED = GGUF_TYPES[2:]
BLOCK_256 = frozenset({"q5_k_m", "q4_k_m", "q3_k_m", "iq3_xxs", "iq2_m"})  # K- and i-quants
_LEGACY = ("Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "F16", "BF16", "F32")


def role(name: str) -> str:
    """``blk.3.ffn_down.weight`` → ``ffn_down``; ``output.weight`` → ``output``."""
    parts = name.split(".")
    return parts[2] if parts[0] == "blk" and len(parts) >= 4 else parts[0]


def tensor_types(path: str | Path) -> dict[str, tuple[str, int]]:
    """Every matrix of the GGUF file at ``path``: its type's name and its row length (``ne0``)."""
    import gguf

    reader = gguf.GGUFReader(str(path))
    out = {}
    for t in reader.tensors:
        if len(t.shape) >= 2 and "norm" not in t.name:
            out[t.name] = (t.tensor_type.name, int(t.shape[0]))
    return out


def type_tally(types: dict[str, tuple[str, int]]) -> dict[str, dict[str, int]]:
    """{role: {type: tensors}} of :func:`tensor_types`."""
    tally: dict[str, Counter] = {}
    for name, (kind, _) in types.items():
        tally.setdefault(role(name), Counter())[kind] += 1
    return {r: dict(sorted(c.items())) for r, c in sorted(tally.items())}


def fallbacks(types: dict[str, tuple[str, int]], quant: str) -> list[dict]:
    """The block matrices of a ``quant`` file that fell back from its K/i type to a legacy one, grouped
    by role, type and row length: ``[{"role", "type", "row", "tensors"}]`` (empty for ``q8_0``)."""
    if quant not in BLOCK_256:
        return []
    groups: Counter = Counter()
    for name, (kind, row) in types.items():
        if name.startswith("blk.") and kind in _LEGACY and row % 256:
            groups[(role(name), kind, row)] += 1
    return [{"role": r, "type": k, "row": n, "tensors": c} for (r, k, n), c in sorted(groups.items())]


def describe_fallbacks(falls: list[dict]) -> list[str]:
    """One line per group of :func:`fallbacks`, for the export's log and the model page."""
    return [
        f"{f['tensors']} × {f['role']}: rows of {f['row']} (not a multiple of 256) fell back to {f['type']}"
        for f in falls
    ]


def to_gguf_names(ready, sums: dict[str, torch.Tensor], tokens: int) -> tuple[dict[str, np.ndarray], dict[str, int]]:
    """The statistics of :func:`input_sums` under the GGUF file's tensor names, in its column order
    (``ready``: :func:`core.serving.gguf_export.check_exportable`'s). Every matrix of the file but the
    token embedding must have them (a tied output head reads its statistics into the embedding's name,
    as llama.cpp's own tool does)."""
    from core.serving.gguf_export import tensors

    sums = dict(sums)
    if "lm_head.weight" in sums and "lm_head.weight" not in ready.reader:  # tied: the embedding is the head
        sums["model.embed_tokens.weight"] = sums.pop("lm_head.weight")
    p = ready.plan
    q_scale = p.extras.get("q_scale", 1.0) if p.arch == "gemma2" else 1.0
    out: dict[str, np.ndarray] = {}
    for name, t in tensors(StatsReader(ready.reader, sums), p):
        if t.dim() != 2 or (name == "token_embd.weight" and "model.embed_tokens.weight" not in sums):
            continue
        row = t[0].to(torch.float64)
        if name.endswith("attn_q.weight") and q_scale != 1.0:
            row = row / q_scale  # the conversion scales the query weights, not their inputs
        if not bool((row > 0).any()):
            raise ExportError(f"no input statistics reached the GGUF tensor {name} (a module the pass did not see)")
        out[name] = row.numpy()
    return out, {n: tokens for n in out}


def collect(checkpoint: str | Path, texts: list[str], calibration, dataset: str) -> Imatrix:
    """The importance matrix of the checkpoint in ``checkpoint`` over ``calibration``'s windows
    (``CalibrationConfig``: samples, length, seed) of ``texts``; ``dataset`` names the text in the file."""
    from core.data.calibration import decoder_windows
    from core.models.loading import load_pruned
    from core.serving.gguf_export import check_exportable

    ready = check_exportable(checkpoint)
    model, tokenizer = load_pruned(checkpoint, dtype=torch.float32)
    fit, _ = decoder_windows(texts, tokenizer, calibration.model_copy(update={"holdout_samples": 0}))
    ids = fit.input_ids
    sums, tokens = input_sums(model, (ids[i : i + 4] for i in range(0, len(ids), 4)))
    del model
    names, counts = to_gguf_names(ready, sums, tokens)
    return Imatrix(names, counts, [dataset], chunk_size=ids.shape[1], chunk_count=ids.shape[0])


def recipe_calibration(directory: Path) -> dict | None:
    """The ``calibration`` mapping of the checkpoint's ``recipe.yaml``, as written (not validated: the
    text it names may be a file of another machine, or a name a server gives its texts); None without one."""
    import yaml

    try:
        recipe = yaml.safe_load((Path(directory) / "recipe.yaml").read_text())
    except (OSError, UnicodeDecodeError, yaml.YAMLError):
        return None
    section = recipe.get("calibration") if isinstance(recipe, dict) else None
    return section if isinstance(section, dict) and (section.get("dataset") or section.get("texts")) else None


def _hinted(message: str, hint: str | None) -> str:
    return f"{message}: {hint}" if hint else message


def imatrix_for(
    directory: Path, text: str | Path | None = None, out: Path | None = None, hint: str | None = IMATRIX_HINT
) -> tuple[Path, str]:
    """The importance matrix of the checkpoint in ``directory``, gathered over its recipe's calibration
    windows of its recipe's calibration text (``text``: of that file instead, with the recipe's window
    settings or defaults), written as ``out`` (default ``<checkpoint>/imatrix.gguf``); (path, what it was
    made from). ``ExportError`` when neither a readable calibration text nor ``text`` is there, ending
    with ``hint`` (what the caller can do about it; None: nothing said)."""
    from pydantic import ValidationError

    from core.data.calibration import load_texts
    from core.serving import imatrix
    from core.spec.errors import validation_message
    from core.spec.recipe import NAMED_DATASETS, CalibrationConfig

    section = recipe_calibration(directory)
    if text is not None:
        section = {**(section or {}), "dataset": str(Path(text).expanduser()), "texts": None}
    if not section:
        raise ExportError(_hinted(f"{directory} has no recipe.yaml with a calibration set", hint))
    dataset = section.get("dataset") if section.get("texts") is None else None
    if dataset and dataset not in NAMED_DATASETS and not Path(dataset).expanduser().is_file():
        said = str(text) if text is not None else dataset
        raise ExportError(_hinted(f"the calibration text {said!r} is not a file on this machine", hint))
    try:
        cfg = CalibrationConfig.model_validate(section)
        texts = load_texts(cfg)
    except ValidationError as exc:
        why = validation_message(exc, "calibration")
        raise ExportError(
            _hinted(f"the calibration text {section.get('dataset')!r} cannot be read here ({why})", hint)
        ) from None
    except (OSError, ValueError) as exc:
        raise ExportError(_hinted(f"the calibration text {cfg.dataset!r} cannot be read here ({exc})", hint)) from None
    name = Path(cfg.dataset).name if cfg.dataset else "calibration texts"
    made = collect(directory, texts, cfg, name)
    path = imatrix.write(out if out is not None else directory / IMATRIX, made)
    what = f"{made.chunk_count} windows of {made.chunk_size} tokens of {name}"
    return path, what


class Matrices:
    """The importance matrix that weights one checkpoint's quantized forms, chosen as ``choice`` says
    (``auto``: gathered from the calibration text, :func:`imatrix_for`; without one, none where the type
    allows it; ``none``; or a file) and gathered at most once, by the first form that wants it: a job
    writing several forms makes one forward pass, not one per form. ``text``: gather over that file;
    ``folder``: where ``imatrix.gguf`` is written (default: the checkpoint); ``hint``: what a refusal
    tells the reader to do (the command's options by default)."""

    def __init__(
        self,
        checkpoint: str | Path,
        choice: str = "auto",
        text: str | Path | None = None,
        folder: Path | None = None,
        hint: str | None = IMATRIX_HINT,
    ):
        self.checkpoint = Path(checkpoint).expanduser()
        self.choice, self.text, self.hint = choice, text, hint
        self.folder = self.checkpoint if folder is None else Path(folder)
        self._gathered: tuple[Path, str] | str | None = None  # (file, what it was made from), or why not

    @property
    def gathered(self) -> Path | None:
        """The file gathered so far (None before the first form that wanted one, or where none could be)."""
        return self._gathered[0] if isinstance(self._gathered, tuple) else None

    def _gather(self) -> tuple[Path, str]:
        if self._gathered is None:
            try:
                self._gathered = imatrix_for(self.checkpoint, self.text, self.folder / IMATRIX, self.hint)
            except ExportError as exc:
                self._gathered = str(exc)
        if isinstance(self._gathered, str):
            raise ExportError(self._gathered)
        return self._gathered

    def resolve(self, quant: str) -> tuple[Path | None, str]:
        """(the importance matrix to quantize to ``quant`` with, one line saying which)."""
        if quant not in QUANTIZED or (quant == "q8_0" and self.choice == "auto"):  # q8_0 rounds without weights
            return None, ""
        if self.choice == "none":
            if quant in NEEDS_IMATRIX:
                raise ExportError(_hinted(f"{quant} needs an importance matrix", self.hint))
            return None, "quantized without an importance matrix"
        if self.choice != "auto":
            return Path(self.choice).expanduser(), f"quantized with the importance matrix {Path(self.choice).name}"
        try:
            path, what = self._gather()
        except ExportError as exc:
            if quant in NEEDS_IMATRIX or self.text is not None:
                raise
            return None, f"quantized without an importance matrix ({exc})"
        return path, f"quantized with an importance matrix from {what}"


def resolve_imatrix(
    directory: str | Path, quant: str, choice: str = "auto", text: str | Path | None = None
) -> tuple[Path | None, str]:
    """(the importance matrix to quantize ``directory`` to ``quant`` with, one line saying which):
    :meth:`Matrices.resolve` of a matrix gathered for this one form."""
    return Matrices(directory, choice, text).resolve(quant)
