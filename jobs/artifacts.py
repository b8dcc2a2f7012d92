"""A finished job's files in the store (``jobs.store``) and how they are served.

A job's checkpoint is offered file by file, as written: no archive, no second pass over the weights.
Each file's size and sha256 come from the checkpoint's ``SHA256SUMS`` (written last by the exporter,
which hashes while writing; ``core.models.manifest``), and become one ``Artifact`` row (kind
``"file"``, its key in the store) beside the row of the directory (kind ``"checkpoint"``). The whole
checkpoint as one download is an uncompressed tar produced on the fly (:class:`TarStream`): no
temporary file, its exact length known in advance. Jobs from before revision 0002 have a ``.tar.gz``
(kind ``"archive"``), still listed and served. The serving files a recipe's ``export`` asks for
(``<name>-<quant>.gguf``) are written inside the checkpoint and listed in its ``SHA256SUMS``, so they
are files of it like any other.

Keys: ``artifacts/job-N/attempt-K/checkpoint/<name>``. Each attempt at a job (``jobs.fencing``)
writes into a folder of its own (:func:`attempt_dir` on the worker, :func:`attempt_key` in the store),
so a worker the reaper gave up on, coming back, cannot write over the files of the attempt that
replaced it; the attempt that succeeds removes what earlier ones left (:func:`remove_earlier_attempts`).
With a store other than the data folder, the worker uploads its checkpoint file by file once it is
written (:func:`publish`), and only then records the rows: what an attempt killed mid-upload sent is
listed nowhere. Jobs finished before attempts had folders keep their checkpoint directly under
``job-N/``.

Every key served is checked to lie inside its job's folder (:func:`inside_job`), and names are
checked before they are looked up (:func:`check_name`).
"""

from __future__ import annotations

import errno
import re
import shutil
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from core.models.manifest import MANIFEST, FileEntry, file_sha256, read_manifest, write_manifest
from jobs.store import Store, check_key

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
    """One file a job offers: its name inside the checkpoint (or the legacy archive's file name) and
    its key in the store."""

    name: str
    key: str
    size: int
    sha256: str | None
    kind: str  # "file" | "archive"
    path: Path | None = None  # the file on this host, when the store is a folder here


ARTIFACTS = "artifacts"  # the store's folder of jobs' files


def job_key(job_id: int) -> str:
    return f"{ARTIFACTS}/job-{job_id}"


def job_dir(artifacts_dir: Path, job_id: int) -> Path:
    return artifacts_dir / f"job-{job_id}"


_ATTEMPT = "attempt-"


def attempt_key(job_id: int, token: int) -> str:
    return f"{job_key(job_id)}/{_ATTEMPT}{token}"


def attempt_dir(artifacts_dir: Path, job_id: int, token: int) -> Path:
    """The folder attempt ``token`` of the job writes into on its worker (inside :func:`job_dir`);
    the same place as :func:`attempt_key` when the store is the data folder."""
    return job_dir(artifacts_dir, job_id) / f"{_ATTEMPT}{token}"


_LEGACY = re.compile(r"^(?:.*/)?(artifacts/job-\d+(?:/.*)?)$")


def stored_key(value: str) -> str:
    """The key an artifact row names: as written since revision 0006, or, for a host's absolute path
    written by an older worker still running through the upgrade, the part from ``artifacts/job-N``
    on (what the migration makes of it; anything else is returned as it is, and refused later)."""
    if value.startswith("/"):
        match = _LEGACY.match(value)
        return match.group(1) if match else value
    return value


def inside_job(key: str, job_id: int) -> str:
    """``key`` if it is a plain key inside the job's folder of the store; ``PermissionError`` if it
    lies elsewhere (a tampered row), ``ValueError`` if it is no plain key."""
    if not key.startswith(f"{job_key(job_id)}/"):
        raise PermissionError(f"{key} is outside the job's folder")
    return check_key(key)


def _earlier(names: list[str], token: int) -> list[str]:
    """The attempt folders of ``names`` before attempt ``token``."""
    numbers = {n: n[len(_ATTEMPT) :] for n in names if n.startswith(_ATTEMPT)}
    return [n for n, number in numbers.items() if number.isdigit() and int(number) < token]


def remove_earlier_attempts(store: Store, artifacts_dir: Path, job_id: int, token: int) -> None:
    """Remove what the job's attempts before ``token`` left (lost or failed runs), on this host and in
    the store: never ``token``'s own, never a later one's."""
    local = job_dir(artifacts_dir, job_id)
    for name in _earlier([p.name for p in local.glob(f"{_ATTEMPT}*")], token):
        shutil.rmtree(local / name, ignore_errors=True)
    if not store.in_place(artifacts_dir.parent):
        for name in _earlier(store.children(job_key(job_id)), token):
            store.delete(f"{job_key(job_id)}/{name}")


def remove_job(store: Store, artifacts_dir: Path, job_id: int) -> None:
    """Remove every file of the job, on this host and in the store (its record is the caller's)."""
    shutil.rmtree(job_dir(artifacts_dir, job_id), ignore_errors=True)
    if not store.in_place(artifacts_dir.parent):
        store.delete(job_key(job_id))


def publish(store: Store, data_dir: Path, checkpoint: Path, files: list[FileEntry], progress=None) -> str:
    """Put the checkpoint written at ``checkpoint`` (inside ``data_dir``) into the store, file by file
    in the order of ``files`` (its manifest last), each checked against its recorded sha256 while it is
    sent; the checkpoint's key. Nothing to send when the store is the data folder. ``progress(done,
    total)`` after each file."""
    key = checkpoint.relative_to(data_dir).as_posix()
    if store.in_place(data_dir):
        return key
    for i, f in enumerate(files):
        store.put(checkpoint / f.name, f"{key}/{f.name}", f.sha256)
        if progress is not None:
            progress(i + 1, len(files))
    return key


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
    """An uncompressed tar (PAX format) of ``files`` under the folder ``prefix``, made while it is sent
    from ``store``.

    ``len(stream)`` is the exact number of bytes (for Content-Length); iterating yields the archive in
    chunks of at most :data:`CHUNK` bytes, reading one file at a time (memory stays at one chunk). A file
    whose size differs from the recorded one stops the stream with ``OSError`` rather than send a
    corrupt archive. ``mtime``: the files' time in the archive (the job's end).
    """

    def __init__(self, files: list[Served], prefix: str, store: Store, mtime: float = 0.0):
        self.store = store
        self.parts = [(_tar_header(f"{prefix}/{f.name}", f.size, mtime), f.key, f.size) for f in files]

    def __len__(self) -> int:
        return sum(len(header) + size + _padding(size) for header, _, size in self.parts) + 2 * _BLOCK

    def __iter__(self) -> Iterator[bytes]:
        for header, key, size in self.parts:
            yield header
            sent = 0
            for chunk in self.store.chunks(key, 0, size):
                sent += len(chunk)
                yield chunk
            if sent != size or self.store.size(key) != size:
                raise OSError(f"{key} changed size while it was being sent ({size} bytes recorded)")
            yield b"\0" * _padding(size)
        yield b"\0" * (2 * _BLOCK)  # end of archive
