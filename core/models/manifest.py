"""``SHA256SUMS``: the size-and-digest list of every file of a checkpoint directory.

Written last into every checkpoint this project saves, in ``sha256sum`` format (``sha256sum -c
SHA256SUMS`` checks a download), so that the service can offer the files themselves for download —
no archive, no second pass over the weights to hash them when the writer already did
(:func:`core.models.safetensors_io.write_shard` hashes while writing).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from pathlib import Path

MANIFEST = "SHA256SUMS"
_CHUNK = 1 << 22


@dataclass(frozen=True)
class FileEntry:
    name: str  # path relative to the checkpoint directory, "/"-separated
    size: int
    sha256: str


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(_CHUNK), b""):
            digest.update(chunk)
    return digest.hexdigest()


def write_manifest(directory: str | Path, known: dict[str, str] | None = None) -> list[FileEntry]:
    """Write ``SHA256SUMS`` for every file under ``directory``; ``known`` maps relative names to
    digests already computed while writing (those files are not read again)."""
    directory = Path(directory)
    known = known or {}
    entries = []
    for path in sorted(p for p in directory.rglob("*") if p.is_file() and p.name != MANIFEST):
        name = path.relative_to(directory).as_posix()
        entries.append(FileEntry(name, path.stat().st_size, known.get(name) or file_sha256(path)))
    text = "".join(f"{e.sha256}  {e.name}\n" for e in entries)
    tmp = directory / f".{MANIFEST}.tmp"
    tmp.write_text(text)
    tmp.replace(directory / MANIFEST)
    return entries


def read_manifest(directory: str | Path) -> list[FileEntry]:
    """The entries of a checkpoint's ``SHA256SUMS`` (sizes from the files on disk); raises
    ``FileNotFoundError`` when there is none or a listed file is missing."""
    directory = Path(directory)
    manifest = directory / MANIFEST
    if not manifest.is_file():
        raise FileNotFoundError(f"{str(directory)!r} has no {MANIFEST} (not a checkpoint written by this project)")
    entries = []
    for line in manifest.read_text().splitlines():
        if not line.strip():
            continue
        digest, name = line.split("  ", 1)
        path = directory / name
        if not path.is_file():
            raise FileNotFoundError(f"{name!r} is listed in {manifest} but missing")
        entries.append(FileEntry(name, path.stat().st_size, digest))
    return entries
