"""A worker's disk running out while it writes a checkpoint, in sentences users may read: they name
the worker's data folder by its setting (``LIAR_DATA_DIR``), and the worker's log has the folder."""

from __future__ import annotations

import errno
import logging
import os
import shutil
from pathlib import Path

from jobs.artifacts import no_space_errno

logger = logging.getLogger("jobs.tasks")


class DiskFull(Exception):
    """The export ran out of disk space or quota; the message says so in one sentence (no folder: users read it)."""


def no_space_message(exc: BaseException, directory: Path) -> str:
    """One sentence for a write that ran out of disk space or quota in ``directory``, or made a file
    larger than the worker's file-size limit (``ulimit -f``) or the file system allow. Users read it:
    it names the worker's data folder by its setting; the worker's log has the folder."""
    code = no_space_errno(exc)
    logger.error("%s while writing to %s", os.strerror(code) if code else "no space", directory)
    if code == errno.EFBIG:
        return (
            "file too large while writing the checkpoint on the worker (past its file-size limit, ulimit -f, or "
            "the file system's largest file); the partial output was removed (raise the limit, or point the "
            "worker's LIAR_DATA_DIR at another file system, and re-run the job)"
        )
    what = "disk quota exceeded" if code == errno.EDQUOT else "no space left on device"
    return (
        f"{what} while writing the checkpoint on the worker; the partial output was removed (free some space "
        "in the worker's LIAR_DATA_DIR, or point it at a larger disk, and re-run the job)"
    )


def short_of_disk(exc: BaseException) -> str | None:
    """The users' sentence for the streamed engine's refusal to start without room for the shards
    (``core.pipeline.streamed.InsufficientDiskSpace``, which names the folder), or None."""
    from core.pipeline.streamed import InsufficientDiskSpace

    if not isinstance(exc, InsufficientDiskSpace):
        return None
    logger.error("%s", exc)  # with the folder, for the worker's operator
    need = str(exc).rpartition(": ")[2]
    return (
        f"not enough disk space on the worker to write the checkpoint: {need} (free some space in the worker's "
        "LIAR_DATA_DIR, or point it at a larger disk, and re-run the job)"
    )


def check_free_space(result, out_dir: Path) -> None:
    """Refuse before writing when the disk has less room than the weights need."""
    model = getattr(result, "model", None)
    if model is None:
        return
    need = sum(p.numel() * p.element_size() for p in model.parameters())
    free = shutil.disk_usage(out_dir).free
    if free < need:
        raise DiskFull(
            f"not enough disk space on the worker to write the checkpoint: the weights need {need / 1e9:.2f} GB "
            f"and {free / 1e9:.2f} GB are free (free some space in the worker's LIAR_DATA_DIR, or point it at a "
            "larger disk, and re-run the job)"
        )
