"""Block-boundary checkpoints: where a run keeps what the rest of its block loop needs, so that a run
stopped after block k (a lost worker, a preempted machine, a polite SIGTERM) starts again at block
k + 1 instead of block 0.

A checkpoint is a set of files and a manifest naming each file's sha256, the block the loop got to and
what made it (the recipe, the calibration windows, the planned keep-sets and the engine's code, each
as a sha256). It is saved whole or not at all: whatever keeps it writes the files first and the
manifest last, and a checkpoint without its manifest does not exist. The engine defines only the
interface (:class:`Checkpoints`; :meth:`~Checkpoints.peek` reads the manifest and one small file
alone, before the rest is needed) and a folder on this host (:class:`FolderCheckpoints`); the job
service keeps its checkpoints in the job's store (``jobs/checkpoints.py``). What goes into one, and
how the loop resumes from it, is ``core/pipeline/resume.py``'s.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from functools import cache
from importlib import metadata
from pathlib import Path
from typing import Protocol

FORMAT = 1  # the checkpoint layout's version: a checkpoint of another layout is refused
MANIFEST = "manifest.json"
_CHUNK = 1 << 20


class CheckpointError(Exception):
    """A checkpoint that cannot be used: its files do not match their sha256, or it was made by
    another recipe or another code version. The message says which; the run then starts over."""


class StopRequested(Exception):
    """Raised by the block loop after it saved a checkpoint because :meth:`Checkpoints.stop_requested`
    said so (a worker asked to stop): the run resumes from it later, on any host."""


class Checkpoints(Protocol):
    """Where one run keeps its checkpoint (the latest replaces the one before, whole)."""

    every_seconds: float  # the least time between two saves (0: after every block)
    label: str  # who saves, as the resumed run's message names it ("attempt 1")

    def save(self, files: dict[str, Path], manifest: dict) -> None:
        """Keep ``files`` (name → file on this host) and then ``manifest`` (whose ``files`` maps each
        name to its sha256) as the checkpoint, replacing the one before only once it is complete."""

    def load(self, into: Path) -> tuple[dict, dict[str, Path]] | None:
        """The checkpoint kept (its manifest, and each file as a path on this host, ``into`` if it had
        to be copied here), its files checked against their sha256 (:class:`CheckpointError`); None
        when there is none."""

    def peek(self, name: str, into: Path) -> tuple[dict, Path | None] | None:
        """The kept checkpoint's manifest and its file ``name`` alone (checked against its sha256,
        :class:`CheckpointError`; None for the file when the checkpoint has none of that name), the
        other files not fetched: what a run reads before its block loop (its scores). None when there
        is no checkpoint."""

    def discard(self) -> None:
        """Remove the checkpoint (a refused one, or one a finished run no longer needs)."""

    def stop_requested(self) -> bool:
        """Whether the run should save a checkpoint at the next block boundary and stop."""

    def note(self, message: str) -> None:
        """One line for the run's log: the resume (``resumed at block 37 of 80, …``) or a refusal."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def check_files(manifest: dict, files: dict[str, Path]) -> None:
    """:class:`CheckpointError` unless every file the manifest names is there with its sha256."""
    for name, digest in manifest.get("files", {}).items():
        path = files.get(name)
        if path is None or not path.is_file():
            raise CheckpointError(f"the checkpoint's file {name} is missing")
        if sha256_file(path) != digest:
            raise CheckpointError(f"the checkpoint's file {name} does not match its recorded sha256")


def check_file(manifest: dict, name: str, path: Path) -> Path | None:
    """``path``, the manifest's file ``name``, checked (:func:`check_files`); None if it names none."""
    digest = manifest.get("files", {}).get(name)
    if digest is None:
        return None
    check_files({"files": {name: digest}}, {name: path})
    return path


@cache
def code_version() -> str:
    """The engine's version and a sha256 of its source: a checkpoint made by other code is refused
    (the block loop's arithmetic may differ, and a resumed model must be the one a whole run makes)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    try:
        version = metadata.version("liar-prune")
    except metadata.PackageNotFoundError:
        version = "unknown"
    return f"{version}+{digest.hexdigest()[:12]}"


class FolderCheckpoints:
    """A run's checkpoint in a folder of this host (``root``): ``root/<n>/`` holds the n-th save, and
    the newest folder with a manifest is the checkpoint. Files a save shares with the one before (a
    block's shard, written once) are hard links where the file system allows."""

    def __init__(self, root: str | Path, every_seconds: float = 300.0, label: str = "an earlier run"):
        self.root, self.every_seconds, self.label = Path(root), float(every_seconds), label
        self.stop = False  # set by the caller (a signal handler) to stop at the next block boundary
        self.notes: list[str] = []

    def _saves(self) -> list[Path]:
        if not self.root.is_dir():
            return []
        found = [p for p in self.root.iterdir() if p.name.isdigit() and (p / MANIFEST).is_file()]
        return sorted(found, key=lambda p: int(p.name))

    def save(self, files: dict[str, Path], manifest: dict) -> None:
        saves = self._saves()
        target = self.root / str(int(saves[-1].name) + 1 if saves else 1)
        shutil.rmtree(target, ignore_errors=True)  # a save that stopped before its manifest
        target.mkdir(parents=True)
        for name, src in files.items():
            _link_or_copy(src, target / name)
        part = target / f"{MANIFEST}.part"
        part.write_text(json.dumps(manifest, indent=1))
        os.replace(part, target / MANIFEST)  # the manifest last: the save exists from here on
        for old in saves:
            shutil.rmtree(old, ignore_errors=True)

    def load(self, into: Path) -> tuple[dict, dict[str, Path]] | None:
        saves = self._saves()
        if not saves:
            return None
        manifest = json.loads((saves[-1] / MANIFEST).read_text())
        files = {name: saves[-1] / name for name in manifest.get("files", {})}
        check_files(manifest, files)
        return manifest, files

    def peek(self, name: str, into: Path) -> tuple[dict, Path | None] | None:
        saves = self._saves()
        if not saves:
            return None
        manifest = json.loads((saves[-1] / MANIFEST).read_text())
        return manifest, check_file(manifest, name, saves[-1] / name)

    def discard(self) -> None:
        shutil.rmtree(self.root, ignore_errors=True)

    def stop_requested(self) -> bool:
        return self.stop

    def note(self, message: str) -> None:
        self.notes.append(message)


def _link_or_copy(src: Path, dest: Path) -> None:
    try:
        os.link(src, dest)
    except OSError:
        shutil.copyfile(src, dest)
