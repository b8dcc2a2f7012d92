"""One serving form written from a checkpoint, the same way wherever it is asked for: a recipe's
``export`` (``core.serving.export``, into the checkpoint), ``liar export`` and the server's export-only
job (``jobs.export_jobs``, into a folder of its own).

A quantized GGUF type is weighted by the importance matrix of :class:`core.serving.quantize.Matrices`
(gathered once per checkpoint, by the first form that wants it), and the log gets one line on which
matrix weighted it and one per group of tensors that fell back from the K/i type to a legacy one
(``quantize.fallbacks``: rows whose length is no multiple of 256).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from core.serving.card import VLLM_DIR, list_forms
from core.serving.quantize import QUANTIZED, Matrices
from core.spec.recipe import GGUF_FORMATS


@dataclass(frozen=True)
class Written:
    """One form written: where, with which importance matrix, and what fell back."""

    form: str
    path: Path  # the GGUF file, or the vLLM folder
    imatrix: str = ""  # the line on the importance matrix ("" where the type takes none)
    fallbacks: list[dict] = field(default_factory=list)  # quantize.fallbacks' groups

    @property
    def size(self) -> int:
        """Bytes on disk: the file's, or the folder's files'."""
        if self.path.is_dir():
            return sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())
        return self.path.stat().st_size

    @property
    def fallen_back(self) -> int:
        """How many tensors fell back from their K/i type."""
        return sum(f["tensors"] for f in self.fallbacks)


def write_form(
    checkpoint: str | Path,
    form: str,
    out: Path | None = None,
    threads: int = 2,
    log: Callable[[str], None] = print,
    matrices: Matrices | None = None,
) -> Written:
    """``form`` (``core.serving.FORMATS``) of the checkpoint in ``checkpoint``, at ``out``: a GGUF file
    (default: inside the checkpoint, ``<name>-<quant>.gguf``) or vLLM's folder (default: its ``vllm/``);
    written inside the checkpoint, it is listed in the checkpoint's card and ``SHA256SUMS``. A quantized
    GGUF type is weighted by ``matrices``' importance matrix (default: gathered for this form alone, into
    the checkpoint); ``log`` gets the line saying which and one per group of tensors that fell back.
    The weights are not checked against ``SHA256SUMS`` here: the caller does that once
    (``gguf_export.verify_checkpoint``)."""
    from core.serving.gguf_export import export_gguf
    from core.serving.quantize import describe_fallbacks, fallbacks, tensor_types
    from core.serving.vllm_form import export_vllm

    checkpoint = Path(checkpoint).expanduser()
    if form == "vllm":
        path = export_vllm(checkpoint, out if out is not None else checkpoint / VLLM_DIR, overwrite=True, verify=False)
        if out is None:
            list_forms(checkpoint)
        return Written(form, path)
    quant = GGUF_FORMATS[form]
    matrices = matrices if matrices is not None else Matrices(checkpoint)
    matrix, said = matrices.resolve(quant) if quant in QUANTIZED else (None, "")
    path = export_gguf(checkpoint, out, quant=quant, threads=threads, verify=False, imatrix=matrix)
    falls = fallbacks(tensor_types(path), quant)
    for line in ([said] if said else []) + describe_fallbacks(falls):
        log(f"{path.name}: {line}")
    return Written(form, path, said, falls)
