"""A job's resume checkpoints in its store (``core/pipeline/checkpoint.py`` defines what the engine
saves; this is where a job keeps it).

Attempt k saves under ``artifacts/job-N/attempt-k/resume/``: each file as ``files/<sha256>`` (a key
is never rewritten with other bytes, so the checkpoint before stays whole while the next is sent) and
then ``manifest.json``, the save's last object; a save without its manifest does not exist. Files
the previous save of the same attempt sent already (a block's shard, written once) are not sent
again; objects no manifest names any more are removed after the manifest is in.

A new attempt resumes from the newest earlier attempt that has a manifest, on whatever worker it
runs, checking every file against its sha256. Fencing is as before (``jobs.fencing``): a save asks
first whether the attempt still owns the job, and an attempt that lost it writes nothing more.
Earlier attempts' folders, checkpoints included, are removed once the job succeeds
(``jobs.artifacts.remove_earlier_attempts``), or kept for the next attempt when it is requeued.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import re
import tempfile
from collections.abc import Callable
from pathlib import Path

from core.pipeline.checkpoint import MANIFEST, CheckpointError, check_file, check_files
from jobs.artifacts import attempt_key, job_key
from jobs.store import Store

logger = logging.getLogger(__name__)
RESUME = "resume"  # the folder of an attempt's checkpoint, beside its ``checkpoint`` output
_ATTEMPT = re.compile(r"^attempt-(\d+)$")


class StoreCheckpoints:
    """The :class:`~core.pipeline.checkpoint.Checkpoints` of attempt ``token`` at job ``job_id``.

    ``owns()`` says whether the attempt still owns the job (else a save raises what ``lost()`` gives);
    ``note(message)`` goes to the job's log; :attr:`stop` is set by the worker's SIGTERM handler."""

    def __init__(
        self,
        store: Store,
        job_id: int,
        token: int,
        every_seconds: float,
        lost: Callable[[], Exception | None] = lambda: None,
        log: Callable[[str], None] = logger.info,
    ):
        self.store, self.job_id, self.token = store, job_id, token
        self.every_seconds, self.label = every_seconds, f"attempt {token}"
        self.prefix = f"{attempt_key(job_id, token)}/{RESUME}"
        self.lost, self.log = lost, log
        self.stop = False
        self.loaded_from: str | None = None  # the prefix of the checkpoint resumed from
        self._sent: dict[str, str] = {}  # sha256 → key of what this attempt's saves hold

    def stop_requested(self) -> bool:
        return self.stop

    def note(self, message: str) -> None:
        self.log(message)

    # --- saving -------------------------------------------------------------------------------
    def save(self, files: dict[str, Path], manifest: dict) -> None:
        exc = self.lost()
        if exc is not None:
            raise exc  # an attempt that lost the job writes nothing more
        keep: dict[str, str] = {}
        for name, path in files.items():
            digest = manifest["files"][name]
            key = self._sent.get(digest) or f"{self.prefix}/files/{digest}"
            if digest not in self._sent:
                self.store.put(path, key, sha256=digest)
            keep[digest] = key
        with tempfile.TemporaryDirectory(prefix="liar-manifest-") as tmp:
            part = Path(tmp) / MANIFEST
            part.write_text(json.dumps(manifest | {"attempt": self.token}, indent=1))
            self.store.put(part, f"{self.prefix}/{MANIFEST}")  # the last object: the save exists from here
        mb = sum(p.stat().st_size for p in files.values()) / 1e6
        after = manifest.get("after") or f"block {manifest['next_block']} of {manifest['blocks']}"  # a target run's
        self.log(f"checkpoint saved after {after} ({mb:.1f} MB)")
        for digest, key in self._sent.items():
            if digest not in keep:
                self.store.delete(key)
        self._sent = keep

    # --- resuming -----------------------------------------------------------------------------
    def load(self, into: Path) -> tuple[dict, dict[str, Path]] | None:
        found = self._newest()
        if found is None:
            return None
        token, prefix = found
        self.loaded_from = prefix
        try:
            manifest = self._manifest(prefix, into)
            files = {
                name: self._read(f"{prefix}/files/{digest}", into / name, digest)
                for name, digest in manifest["files"].items()
            }
        except (OSError, ValueError, KeyError) as exc:  # gone, corrupt, unreadable: not this one
            raise CheckpointError(f"attempt {token}'s checkpoint cannot be read ({type(exc).__name__})") from None
        check_files(manifest, files)
        return manifest, files

    def peek(self, name: str, into: Path) -> tuple[dict, Path | None] | None:
        """The newest earlier checkpoint's manifest and its file ``name``, nothing else downloaded."""
        found = self._newest()
        if found is None:
            return None
        token, prefix = found
        try:
            manifest = self._manifest(prefix, into)
            digest = manifest["files"].get(name)
            path = None if digest is None else self._read(f"{prefix}/files/{digest}", into / name, digest)
        except (OSError, ValueError, KeyError, AttributeError) as exc:
            raise CheckpointError(f"attempt {token}'s checkpoint cannot be read ({type(exc).__name__})") from None
        return manifest, None if path is None else check_file(manifest, name, path)

    def _newest(self) -> tuple[int, str] | None:
        """The newest earlier attempt with a checkpoint (its manifest is in): its token and prefix."""
        for token in self._earlier():
            prefix = f"{attempt_key(self.job_id, token)}/{RESUME}"
            if self.store.exists(f"{prefix}/{MANIFEST}"):
                return token, prefix
        return None

    def _manifest(self, prefix: str, into: Path) -> dict:
        return json.loads(self._read(f"{prefix}/{MANIFEST}", into / MANIFEST).read_text())

    def _earlier(self) -> list[int]:
        """The job's attempts before this one, newest first."""
        found = (_ATTEMPT.match(name) for name in self.store.children(job_key(self.job_id)))
        return sorted((int(m.group(1)) for m in found if m and int(m.group(1)) < self.token), reverse=True)

    def _read(self, key: str, dest: Path, sha256: str | None = None) -> Path:
        """``key`` as a file on this host: a folder store's own file, else downloaded to ``dest``."""
        if self.store.local is not None:
            path = self.store.path(key)
            if not path.is_file():
                raise FileNotFoundError(key)
            return path
        dest.parent.mkdir(parents=True, exist_ok=True)
        with self.store.open(key) as src, open(dest, "wb") as out:
            while chunk := src.read(1 << 20):
                out.write(chunk)
        return dest

    def discard(self) -> None:
        """Remove the checkpoint resumed from (refused: it will never fit this job) — only that one."""
        if self.loaded_from is not None:
            try:
                self.store.delete(self.loaded_from)
            except OSError:
                pass


_STARTED = re.compile(r"^started on (?P<worker>.+)$")
_RESUMED = re.compile(r"^resumed at block (?P<block>\d+) of (?P<n>\d+)")
_SAVED = re.compile(r"(?:checkpoint saved|stopped) after block (?P<block>\d+) of (?P<n>\d+)")


def attempts(log: list[dict]) -> list[dict]:
    """The job's attempts read from its log (``jobs show``): each one's worker, the block it started
    at (1, or where it resumed), the last block its checkpoints kept, and its minutes (to the next
    attempt's start, or the log's last line), so the time a lost or stopped worker cost is visible."""
    found: list[dict] = []
    for line in log:
        message, at = line["message"], dt.datetime.fromisoformat(line["at"])
        if m := _STARTED.match(message):
            found.append({"attempt": len(found) + 1, "worker": m["worker"], "start": at, "end": at})
            found[-1] |= {"from_block": 1, "saved_block": None, "blocks": None}
        elif found:
            found[-1]["end"] = at
            if m := _RESUMED.match(message):
                found[-1] |= {"from_block": int(m["block"]), "blocks": int(m["n"])}
            elif m := _SAVED.search(message):
                found[-1] |= {"saved_block": int(m["block"]), "blocks": int(m["n"])}
    for i, a in enumerate(found):
        end = found[i + 1]["start"] if i + 1 < len(found) else a["end"]
        a["minutes"] = round((end - a.pop("start")).total_seconds() / 60, 2)
        a.pop("end")
    return found
