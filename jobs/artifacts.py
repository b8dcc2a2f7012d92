"""The artifact store: what a finished job leaves under ``$LIAR_DATA_DIR/artifacts/job-N/`` and how it
is served.

A job's checkpoint is offered file by file, as written: no archive, no second pass over the weights.
Each file's size and sha256 come from the checkpoint's ``SHA256SUMS`` (written last by the exporter,
which hashes while writing; ``core.models.manifest``), and become one ``Artifact`` row (kind
``"file"``) beside the row of the directory (kind ``"checkpoint"``). The whole checkpoint as one
download is an uncompressed tar produced on the fly (:func:`tar_stream`): no temporary file, its exact
length known in advance. Jobs from before revision 0002 have a ``.tar.gz`` (kind ``"archive"``),
still listed and served. The serving files a recipe's ``export`` asks for (``<name>-<quant>.gguf``)
are written inside the checkpoint and listed in its ``SHA256SUMS``, so they are files of it like any
other.

Each attempt at a job (``jobs.fencing``) writes into a folder of its own, ``job-N/attempt-K/``
(:func:`attempt_dir`, K its attempt number), so a worker the reaper gave up on, coming back, cannot
write over the files of the attempt that replaced it; the attempt that succeeds removes the folders
of earlier ones (:func:`remove_earlier_attempts`). Jobs finished before attempts had folders keep
their checkpoint directly under ``job-N/``.

Every path served is checked to lie inside its job's folder (:func:`confined`), and names are
checked before they are looked up (:func:`check_name`).
"""

from __future__ import annotations

import errno
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.models.manifest import MANIFEST, FileEntry, file_sha256, read_manifest, write_manifest

CHUNK = 1 << 20
_BLOCK = tarfile.BLOCKSIZE  # 512
# a full disk, a full quota, a file past the process's file-size limit (ulimit -f) or the file system's
_NO_SPACE = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG}
# how such an error reads when it arrives as text (safetensors' Rust writer, a wrapped error)
_NO_SPACE_TEXT = {
    "no space left on device": errno.ENOSPC,
    "os error 28": errno.ENOSPC,
    "storagefull": errno.ENOSPC,
    "disk quota exceeded": errno.EDQUOT,
    "os error 122": errno.EDQUOT,
    "file too large": errno.EFBIG,
    "os error 27": errno.EFBIG,
    "filetoolarge": errno.EFBIG,
}


@dataclass(frozen=True)
class Served:
    """One file a job offers: its name inside the checkpoint (or the legacy archive's file name)."""

    name: str
    path: Path
    size: int
    sha256: str | None
    kind: str  # "file" | "archive"


def job_dir(artifacts_dir: Path, job_id: int) -> Path:
    return artifacts_dir / f"job-{job_id}"


_ATTEMPT = "attempt-"


def attempt_dir(artifacts_dir: Path, job_id: int, token: int) -> Path:
    """The folder attempt ``token`` of the job writes into (inside :func:`job_dir`)."""
    return job_dir(artifacts_dir, job_id) / f"{_ATTEMPT}{token}"


def remove_earlier_attempts(artifacts_dir: Path, job_id: int, token: int) -> None:
    """Remove the folders of the job's attempts before ``token`` (what lost or failed runs left):
    never ``token``'s own, never a later one's."""
    for folder in job_dir(artifacts_dir, job_id).glob(f"{_ATTEMPT}*"):
        number = folder.name[len(_ATTEMPT) :]
        if number.isdigit() and int(number) < token:
            shutil.rmtree(folder, ignore_errors=True)


def checkpoint_files(checkpoint: Path) -> tuple[list[FileEntry], bool]:
    """The checkpoint's files from its ``SHA256SUMS``, the manifest itself last (its digest is of a
    few kilobytes); ``True`` as second value when there was no manifest and one had to be written
    (hashing every file: a checkpoint not written by this project's exporter)."""
    try:
        entries, hashed = read_manifest(checkpoint), False
    except FileNotFoundError:
        if (checkpoint / MANIFEST).exists():
            raise  # a listed file is missing: the checkpoint is broken
        entries, hashed = write_manifest(checkpoint), True
    manifest = checkpoint / MANIFEST
    return [*entries, FileEntry(MANIFEST, manifest.stat().st_size, file_sha256(manifest))], hashed


def is_no_space(exc: BaseException) -> bool:
    """Whether ``exc`` (or what caused it) says the disk or the quota is full, or a file outgrew the
    file-size limit."""
    return no_space_errno(exc) is not None


def no_space_errno(exc: BaseException) -> int | None:
    """``ENOSPC``, ``EDQUOT`` or ``EFBIG`` if ``exc`` (or what caused it) is one, else None."""
    seen: set[int] = set()
    cur: BaseException | None = exc
    while cur is not None and id(cur) not in seen:
        seen.add(id(cur))
        if isinstance(cur, OSError) and cur.errno in _NO_SPACE:
            return cur.errno
        text = str(cur).lower()
        code = next((code for t, code in _NO_SPACE_TEXT.items() if t in text), None)
        if code is not None:
            return code
        cur = cur.__cause__ or cur.__context__
    return None


def check_name(name: str) -> str:
    """A file name as asked for in a download URL, refused (``ValueError``) unless it is a plain
    relative path: no ``..``, no absolute path, no backslash, no empty part."""
    if not name or "\\" in name or "\x00" in name or any(p in ("", ".", "..") for p in name.split("/")):
        raise ValueError(f"{name!r} is not a file name inside a checkpoint")
    return name


def confined(path: Path, root: Path) -> Path:
    """``path`` with links resolved, if it is a regular file inside ``root``; ``PermissionError``
    if it lies outside (a tampered row, a link out of the folder), ``FileNotFoundError`` if gone."""
    resolved, top = Path(path).resolve(), Path(root).resolve()
    if top not in resolved.parents:
        raise PermissionError(f"{path} is outside the job's folder {root}")
    if not resolved.is_file():
        raise FileNotFoundError(f"{path} is no longer there")
    return resolved


def _tar_header(arcname: str, size: int, mtime: float) -> bytes:
    info = tarfile.TarInfo(arcname)
    info.size, info.mtime, info.mode, info.type = size, int(mtime), 0o644, tarfile.REGTYPE
    return info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")


def _padding(size: int) -> int:
    return -size % _BLOCK


class TarStream:
    """An uncompressed tar (PAX format) of ``files`` under the folder ``prefix``, made while it is sent.

    ``len(stream)`` is the exact number of bytes (for Content-Length); iterating yields the archive in
    chunks of at most :data:`CHUNK` bytes, reading one file at a time (memory stays at one chunk). A file
    whose size changed since it was recorded stops the stream with ``OSError`` rather than send a
    corrupt archive.
    """

    def __init__(self, files: list[Served], prefix: str):
        self.parts = [
            (_tar_header(f"{prefix}/{f.name}", f.size, f.path.stat().st_mtime), f.path, f.size) for f in files
        ]

    def __len__(self) -> int:
        return sum(len(header) + size + _padding(size) for header, _, size in self.parts) + 2 * _BLOCK

    def __iter__(self) -> Iterator[bytes]:
        for header, path, size in self.parts:
            yield header
            sent = 0
            with open(path, "rb") as f:
                while chunk := f.read(min(CHUNK, size - sent)):
                    sent += len(chunk)
                    yield chunk
                    if sent == size:
                        break
            if sent != size or path.stat().st_size != size:
                raise OSError(f"{path} changed size while it was being sent ({size} bytes recorded)")
            yield b"\0" * _padding(size)
        yield b"\0" * (2 * _BLOCK)  # end of archive
