"""Reading single tensors from safetensors shards, and writing shards one block at a time.

The reader parses each shard's header itself and reads a tensor with one ``readinto`` straight into
the destination buffer (pinned host memory when the target is a GPU): no memory map, so reading a
70B checkpoint block by block never holds more than the block in memory, and a missing or truncated
shard is reported by name before anything is computed.

The writer writes one shard per call (a streamed run writes one per block, as soon as the block is
pruned) and hashes the file while writing it, so the checkpoint's ``SHA256SUMS`` costs no extra read.
"""

from __future__ import annotations

import errno
import hashlib
import json
import math
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from core.models.host_memory import mapped_copy, mapped_empty

INDEX = "model.safetensors.index.json"
SINGLE = "model.safetensors"

_DTYPES = {
    "F64": torch.float64,
    "F32": torch.float32,
    "F16": torch.float16,
    "BF16": torch.bfloat16,
    "I64": torch.int64,
    "I32": torch.int32,
    "I16": torch.int16,
    "I8": torch.int8,
    "U8": torch.uint8,
    "BOOL": torch.bool,
}
_CODES = {v: k for k, v in _DTYPES.items()}


class CheckpointError(ValueError):
    """A checkpoint's files are missing, truncated or inconsistent (the message names the file)."""


@dataclass(frozen=True)
class _Entry:
    file: Path
    dtype: torch.dtype
    shape: tuple[int, ...]
    start: int  # absolute byte offset in the file
    nbytes: int


def _read_header(path: Path) -> tuple[dict, int]:
    try:
        size = path.stat().st_size
        with open(path, "rb") as f:
            head = f.read(8)
            if len(head) < 8:
                raise CheckpointError(f"shard {str(path)!r} is truncated ({size} bytes, no safetensors header)")
            (n,) = struct.unpack("<Q", head)
            if n > 100 * 2**20 or 8 + n > size:
                raise CheckpointError(f"shard {str(path)!r} is truncated or not a safetensors file")
            header = json.loads(f.read(n))
    except FileNotFoundError:
        raise CheckpointError(f"shard {str(path)!r} is missing") from None
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise CheckpointError(f"shard {str(path)!r} has a corrupt safetensors header") from None
    return header, 8 + n


class CheckpointReader:
    """The tensors of a Hugging Face checkpoint directory (sharded or single-file safetensors).

    Every shard's header is read and checked against the file's size on construction, so a missing
    or truncated shard fails here, naming the file, before any work is done.
    """

    def __init__(self, directory: str | Path):
        self.directory = Path(directory)
        index = self.directory / INDEX
        if index.is_file():
            try:
                weight_map = json.loads(index.read_text())["weight_map"]
            except (json.JSONDecodeError, KeyError, TypeError):
                raise CheckpointError(f"{str(index)!r} is not a safetensors index (no weight_map)") from None
            files = sorted(set(weight_map.values()))
        elif (self.directory / SINGLE).is_file():
            files = [SINGLE]
        else:
            raise CheckpointError(
                f"{str(self.directory)!r} has no safetensors weights ({SINGLE} or {INDEX}); "
                "convert .bin checkpoints with save_pretrained(..., safe_serialization=True)"
            )
        self.entries: dict[str, _Entry] = {}
        for name in files:
            path = self.directory / name
            header, data_start = _read_header(path)
            size = path.stat().st_size
            for key, info in header.items():
                if key == "__metadata__":
                    continue
                if info["dtype"] not in _DTYPES:
                    raise CheckpointError(f"tensor {key!r} in {str(path)!r} has unsupported dtype {info['dtype']}")
                begin, end = info["data_offsets"]
                if data_start + end > size:
                    raise CheckpointError(
                        f"shard {str(path)!r} is truncated: tensor {key!r} ends at byte {data_start + end} "
                        f"of a {size}-byte file"
                    )
                self.entries[key] = _Entry(
                    path, _DTYPES[info["dtype"]], tuple(info["shape"]), data_start + begin, end - begin
                )
        if index.is_file():
            missing = sorted(k for k in weight_map if k not in self.entries)
            if missing:
                raise CheckpointError(
                    f"{len(missing)} tensors listed in {str(index)!r} are not in their shards, e.g. {missing[0]!r} "
                    f"(expected in {weight_map[missing[0]]!r})"
                )

    def __contains__(self, name: str) -> bool:
        return name in self.entries

    def read(self, name: str, device: torch.device | str = "cpu", dtype: torch.dtype | None = None) -> torch.Tensor:
        """One tensor, read from its shard into a fresh buffer, then moved / cast as asked."""
        device = torch.device(device)
        return place(self.read_host(name, pinned=device.type == "cuda"), device, dtype)

    def read_host(self, name: str, pinned: bool = False) -> torch.Tensor:
        """One tensor as stored, in a fresh host buffer (page-locked with ``pinned``, for an
        asynchronous copy to a GPU). Safe to call from another thread: each call opens the file."""
        e = self.entries[name]
        # outside the heap unless pinned: a block's weights must not pin it (core/models/host_memory.py)
        host = torch.empty(e.shape, dtype=e.dtype, pin_memory=True) if pinned else mapped_empty(e.shape, e.dtype)
        if e.nbytes:
            view = memoryview(host.view(-1).view(torch.uint8).numpy())
            with open(e.file, "rb", buffering=0) as f:
                f.seek(e.start)
                got = 0
                while got < e.nbytes:
                    n = f.readinto(view[got:])
                    if not n:
                        raise CheckpointError(f"shard {str(e.file)!r} is truncated while reading {name!r}")
                    got += n
        return host


def place(host: torch.Tensor, device: torch.device, dtype: torch.dtype | None = None) -> torch.Tensor:
    """A tensor read by :meth:`CheckpointReader.read_host` on ``device`` in ``dtype`` (None: as stored);
    a cast on the host is a mapped copy too."""
    if device.type == "cpu" and dtype is not None and host.dtype != dtype:
        return mapped_copy(host, dtype)
    out = host.to(device, non_blocking=device.type == "cuda")
    return out if dtype is None or out.dtype == dtype else out.to(dtype)


@dataclass(frozen=True)
class LazyTensor:
    """A tensor known by shape and dtype, produced by ``load()`` only when its bytes are written."""

    shape: tuple[int, ...]
    dtype: torch.dtype
    load: Callable[[], torch.Tensor]

    def numel(self) -> int:
        return math.prod(self.shape)

    def element_size(self) -> int:
        return self.dtype.itemsize


def write_shard(path: str | Path, tensors: list[tuple[str, torch.Tensor | LazyTensor]]) -> str:
    """Write one safetensors file (header, then each tensor's bytes, moved to the host — or loaded,
    for a :class:`LazyTensor` — one at a time) and return its sha256, computed while writing. A full
    disk raises ``OSError`` naming the file."""
    path = Path(path)
    entries, offset = {}, 0
    for name, t in tensors:
        if t.dtype not in _CODES:
            raise ValueError(f"tensor {name!r} has unsupported dtype {t.dtype}")
        nbytes = t.numel() * t.element_size()
        entries[name] = {"dtype": _CODES[t.dtype], "shape": list(t.shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    header = json.dumps({"__metadata__": {"format": "pt"}, **entries}, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    digest = hashlib.sha256()

    def write(f, data) -> None:
        f.write(data)
        digest.update(data)

    try:
        with open(path, "wb") as f:
            write(f, struct.pack("<Q", len(header)) + header)
            for _, t in tensors:
                if t.numel():
                    host = (t.load() if isinstance(t, LazyTensor) else t.detach()).to("cpu").contiguous()
                    write(f, memoryview(host.view(-1).view(torch.uint8).numpy()))
            f.flush()
            os.fsync(f.fileno())
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, getattr(errno, "EDQUOT", -1)):
            raise OSError(exc.errno, f"disk full while writing {str(path)!r}") from exc
        raise
    return digest.hexdigest()
