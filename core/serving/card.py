"""The serving files of a checkpoint, listed in its model card and its ``SHA256SUMS``."""

from __future__ import annotations

from pathlib import Path

from core.models.manifest import MANIFEST, read_manifest, write_manifest

MARKS = ("<!-- gguf-files -->", "<!-- /gguf-files -->")
VLLM_DIR = "vllm"  # the vLLM form's folder inside a checkpoint


def _rows(directory: Path) -> list[str]:
    rows = [
        f"- `{f.name}` ({f.stat().st_size / 2**20:,.1f} MiB): `llama-cli -m {f.name}`"
        for f in sorted(directory.glob("*.gguf"))
    ]
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
