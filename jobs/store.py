"""Where jobs' files live: the data folder of this machine (the default) or any store fsspec reaches
(S3 and what speaks its protocol: MinIO, Ceph, R2; GCS and Azure with their fsspec packages), named by
one setting, ``LIAR_STORE``.

Everything in it is named by a *key*, a ``/``-separated path relative to the store's root:
``artifacts/job-7/attempt-1/checkpoint/model.safetensors``, ``uploads/4ae1….jsonl``. The database
holds keys, never a host's path, so the web host and every worker may have a data folder of its own.

- **The default** (no ``LIAR_STORE``): the store is the data folder itself, so a key is the path
  relative to ``$LIAR_DATA_DIR``. A worker writes its checkpoint in place and nothing is copied: the
  single-user layout of earlier releases, unchanged.
- **Any other store**: each host's data folder is its scratch space and cache. A worker writes its
  checkpoint under its own ``artifacts/…`` and then uploads it file by file (:meth:`Store.put`, the
  sha256 computed while the bytes go out and checked against the one the exporter computed while
  writing). A host that needs another job's checkpoint or an upload downloads it once, to
  ``cache/<key>`` in its data folder (:meth:`Store.fetch`, checked against the recorded sha256).

An object becomes visible in the store only once it is complete (S3 publishes an object when its
upload completes; a folder store writes ``<key>.part`` and renames it), and a job's files become
visible to users only once the job's rows are recorded, after the last upload: a worker killed in the
middle of an upload leaves objects nobody lists, which the attempt that replaces it removes.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO

CHUNK = 1 << 20  # bytes read and written at a time: memory stays at one chunk whatever the file's size
URL_SECONDS = 3600  # a presigned download address's life: long enough to start a 140 GB download


def check_key(key: str) -> str:
    """``key`` if it is a plain relative ``/``-separated path (no ``..``, no empty part, no backslash);
    ``ValueError`` otherwise: what every key from a database row or a URL goes through."""
    if not key or "\\" in key or "\x00" in key or any(p in ("", ".", "..") for p in key.split("/")):
        raise ValueError(f"{key!r} is not a key inside the store")
    return key


class ChecksumMismatch(OSError):
    """A file's bytes do not have the sha256 recorded for them (a corrupt copy, a store that changed)."""


class Store:
    """One store: ``url`` a folder or an fsspec URL (``s3://bucket/prefix``), ``cache_dir`` where this
    host keeps what it downloads, ``presign``: whether downloads may be handed to the store as signed
    addresses (off when users cannot reach the store's endpoint), ``options``: the filesystem's own
    (``endpoint_url`` for an S3-compatible server; credentials come from its usual environment)."""

    def __init__(self, url: str | Path, cache_dir: Path, presign: bool = True, **options: Any):
        import fsspec

        self.location = str(url)
        self.fs, root = fsspec.core.url_to_fs(self.location, **options)
        protocols = self.fs.protocol if isinstance(self.fs.protocol, tuple) else (self.fs.protocol,)
        self.local = Path(root) if "file" in protocols or "local" in protocols else None
        self.root = root.rstrip("/")
        self.cache_dir = Path(cache_dir)
        self.presign = presign and self.local is None

    def __repr__(self) -> str:
        return f"Store({self.location!r})"

    def _full(self, key: str) -> str:
        return f"{self.root}/{check_key(key)}"

    def in_place(self, data_dir: Path) -> bool:
        """Whether this store is ``data_dir`` itself: a worker's files are then already stored."""
        return self.local is not None and self.local.resolve() == Path(data_dir).resolve()

    def path(self, key: str) -> Path:
        """Where ``key`` is on this host: in a folder store, the file itself; otherwise its cached copy
        (which :meth:`fetch` makes)."""
        return (self.local if self.local is not None else self.cache_dir) / check_key(key)

    # --- writing ------------------------------------------------------------------------------
    def put(self, src: Path, key: str, sha256: str | None = None) -> tuple[int, str]:
        """Upload ``src`` as ``key``, hashing while it is sent; its size and sha256. A digest other
        than ``sha256`` (when given) raises :class:`ChecksumMismatch`, and the object is removed."""
        full = self._full(key)
        target = f"{full}.part" if self.local is not None else full  # a folder's file appears whole
        if self.local is not None:
            Path(full).parent.mkdir(parents=True, exist_ok=True)
        digest, size = hashlib.sha256(), 0
        try:
            with open(src, "rb") as f, self.fs.open(target, "wb") as out:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    size += len(chunk)
                if sha256 is not None and digest.hexdigest() != sha256:
                    raise ChecksumMismatch(f"{src} changed while it was uploaded (its sha256 is not the recorded one)")
        except BaseException:
            self._remove(target)
            raise
        if target != full:
            self.fs.mv(target, full)
        return size, digest.hexdigest()

    def _remove(self, full: str) -> None:
        try:
            if self.fs.exists(full):
                self.fs.rm(full)
        except OSError:
            pass  # nothing to remove, or the store is unreachable: an unlisted object, collected later

    def delete(self, prefix: str) -> None:
        """Remove every object under ``prefix`` (a folder's worth of keys); nothing if there are none."""
        full = self._full(prefix)
        try:
            self.fs.rm(full, recursive=True)
        except FileNotFoundError:
            pass
        self.fs.invalidate_cache()

    # --- reading ------------------------------------------------------------------------------
    def exists(self, key: str) -> bool:
        return self.fs.exists(self._full(key))

    def size(self, key: str) -> int:
        return int(self.fs.info(self._full(key))["size"])

    def children(self, prefix: str) -> list[str]:
        """The names directly under ``prefix`` (the attempts of a job: ``attempt-1``, …); [] if none."""
        try:
            entries = self.fs.ls(self._full(prefix), detail=False, refresh=True)
        except FileNotFoundError:
            return []
        return sorted(PurePosixPath(e.rstrip("/")).name for e in entries)

    def open(self, key: str) -> BinaryIO:
        return self.fs.open(self._full(key), "rb")

    def chunks(self, key: str, start: int = 0, length: int | None = None) -> Iterator[bytes]:
        """The bytes of ``key`` from ``start``, ``length`` of them (all when None), a chunk at a time."""
        left = self.size(key) - start if length is None else length
        with self.open(key) as f:
            f.seek(start)
            while left > 0 and (chunk := f.read(min(CHUNK, left))):
                left -= len(chunk)
                yield chunk
        if left > 0:
            raise OSError(f"{key} changed size while it was being sent ({left} bytes short)")

    def url(self, key: str, filename: str, seconds: int = URL_SECONDS) -> str | None:
        """A signed address that downloads ``key`` straight from the store as ``filename``, or None
        where the store cannot sign one (a folder) or presigning is off."""
        if not self.presign:
            return None
        try:
            return self.fs.sign(
                self._full(key), expiration=seconds, ResponseContentDisposition=f'attachment; filename="{filename}"'
            )
        except (NotImplementedError, TypeError):
            return None

    def fetch(self, key: str, size: int | None = None, sha256: str | None = None) -> Path:
        """``key`` as a file on this host: in a folder store the file itself (``FileNotFoundError`` if
        it is gone); otherwise downloaded once to ``cache/<key>``, checked against ``size`` and
        ``sha256`` (:class:`ChecksumMismatch`), and written whole or not at all (two processes may
        fetch the same key at once)."""
        dest = self.path(key)
        if self.local is not None:
            if not dest.is_file():
                raise FileNotFoundError(f"{key} is not in the store")
            return dest
        if dest.is_file() and (size is None or dest.stat().st_size == size):
            return dest
        dest.parent.mkdir(parents=True, exist_ok=True)
        part = dest.with_name(f"{dest.name}.{os.getpid()}.part")
        digest, got = hashlib.sha256(), 0
        try:
            with self.fs.open(self._full(key), "rb") as f, open(part, "wb") as out:
                while chunk := f.read(CHUNK):
                    digest.update(chunk)
                    out.write(chunk)
                    got += len(chunk)
            if (size is not None and got != size) or (sha256 is not None and digest.hexdigest() != sha256):
                raise ChecksumMismatch(f"{key} in the store is not the file recorded ({got} bytes, sha256 differs)")
            os.replace(part, dest)
        finally:
            part.unlink(missing_ok=True)
        return dest


def store_options(endpoint: str | None) -> dict[str, Any]:
    """The fsspec options for ``LIAR_STORE_ENDPOINT`` (an S3-compatible server's address)."""
    return {"endpoint_url": endpoint} if endpoint else {}
