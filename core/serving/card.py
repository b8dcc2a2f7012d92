"""The serving files of a checkpoint, listed in its model card and its ``SHA256SUMS``."""

from __future__ import annotations

from pathlib import Path

from core.models.manifest import MANIFEST, file_sha256, read_manifest, write_manifest
from core.serving.layout import ExportError

MARKS = ("<!-- gguf-files -->", "<!-- /gguf-files -->")
VLLM_DIR = "vllm"  # the vLLM form's folder inside a checkpoint
IMATRIX = "imatrix.gguf"  # the importance matrix the quantized files were made with (core.serving.imatrix)


def _rows(directory: Path) -> list[str]:
    rows = []
    for f in sorted(directory.glob("*.gguf")):
        size = f"{f.stat().st_size / 2**20:,.1f} MiB"
        if f.name == IMATRIX:
            rows.append(f"- `{f.name}` ({size}): the importance matrix, for `llama-quantize --imatrix {f.name}`")
        else:
            rows.append(f"- `{f.name}` ({size}): `llama-cli -m {f.name}`")
    if (directory / VLLM_DIR / "config.json").is_file():
        size = sum(f.stat().st_size for f in (directory / VLLM_DIR).rglob("*") if f.is_file()) / 2**20
        rows.append(f"- `{VLLM_DIR}/` ({size:,.1f} MiB): `vllm serve {VLLM_DIR} --trust-remote-code`")
    return rows


def list_forms(directory: str | Path) -> None:
    """Rewrite the card's list of serving files (GGUF files, the vLLM folder) from what ``directory``
    holds, and add the new files to ``SHA256SUMS`` (the digests already there are not recomputed)."""
    directory = Path(directory)
    card = directory / "README.md"
    if card.is_file():
        text = card.read_text()
        start, end = MARKS
        if start not in text or end not in text:
            text = text.rstrip("\n") + f"\n\n## Serving files\n{start}\n{end}\n"
        head, rest = text.split(start, 1)
        tail = rest.split(end, 1)[1]
        card.write_text(head + start + "\n" + "".join(r + "\n" for r in _rows(directory)) + end + tail)
    if (directory / MANIFEST).is_file():
        known = {e.name: e.sha256 for e in read_manifest(directory) if e.name != "README.md"}
        write_manifest(directory, known)


_HASHED: dict[tuple[str, int, int], str] = {}  # (path, size, mtime) → sha256, of the weight files hashed


def _digest(path: Path) -> str:
    """The file's sha256, hashed once per process while its size and modification time stay the same
    (a job writing several forms checks the same checkpoint before each)."""
    st = path.stat()
    key = (str(path.resolve()), st.st_size, st.st_mtime_ns)
    if key not in _HASHED:
        _HASHED[key] = file_sha256(path)
    return _HASHED[key]


def verify_checkpoint(directory: Path) -> None:
    """Check the weight files against the checkpoint's ``SHA256SUMS`` (when it has one): a corrupt file
    is named before anything is written."""
    manifest = directory / MANIFEST
    if not manifest.is_file():
        return
    try:
        entries = read_manifest(directory)
    except (FileNotFoundError, ValueError) as exc:
        raise ExportError(f"the checkpoint is incomplete: {exc}") from None
    for e in entries:
        if e.name.endswith(".safetensors") and _digest(directory / e.name) != e.sha256:
            raise ExportError(f"{directory / e.name} does not match its digest in {MANIFEST}: the file is corrupt")
