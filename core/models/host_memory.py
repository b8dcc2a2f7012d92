"""Host memory of a CPU run: a streamed run gives freed memory back, an in-memory run reuses it.

A run allocates and frees activation-sized tensors for every batch of every block (gate/up outputs,
Gram buffers, replayed inputs). glibc serves an allocation above its mmap threshold by a fresh
mapping, returned to the OS when freed, so each such tensor is page-faulted in again on its next use;
below the threshold it comes from the heap, whose freed holes are reused — but also pinned by any
long-lived allocation next to them, and sizes that change from layer to layer (a pruned width, an
aligned request a few bytes larger than the hole) leave holes nothing fits. Measured on a 2-core CPU:

- SmolLM2-135M in memory, 128 × 128 calibration: 3.2 M page faults and 55.6 s with glibc's own
  adaptive threshold, 0.4 M and 46.1 s with the heap keeping freed memory;
- a TinyLlama-1.1B-shaped checkpoint streamed with every allocation above 64 KiB mapped: 84 M page
  faults, 541 s, peak RSS 1.99 GB; with allocations up to 32 MiB kept in the heap the peak RSS grew
  past 2.4 GB (fragmentation), for little time saved.

So the policy follows what the run is for. A streamed run exists to bound memory: it maps every
allocation above :data:`STREAM_MMAP_BYTES` (:func:`release_freed_memory`) and pays in page faults.
An in-memory run holds the whole model anyway: it keeps freed memory for reuse
(:func:`reuse_freed_memory`). Either way a streamed block's weights are read into their own anonymous
mappings (:func:`mapped_empty`), outside the heap, freed with the block whatever the thresholds.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
from collections.abc import Iterator
from contextlib import contextmanager

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
KEEP_BYTES = 256 * 2**20  # in memory: allocations up to this come from the heap, this much free heap top is kept
STREAM_MMAP_BYTES = 64 * 2**10  # streamed: every allocation above this is its own mapping


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 — both must exist (glibc)
    except (OSError, AttributeError):  # not glibc: the platform's allocator is left as it is
        return None
    return libc


def release_freed_memory() -> bool:
    """A streamed run's policy: every allocation above :data:`STREAM_MMAP_BYTES` is its own mapping, so
    freed memory goes back to the OS at once and the resident set stays near one block's worth. Stays
    set after the run (until an in-memory run changes it); False off glibc."""
    libc = _libc()
    return libc is not None and bool(libc.mallopt(_M_MMAP_THRESHOLD, STREAM_MMAP_BYTES))


@contextmanager
def reuse_freed_memory() -> Iterator[bool]:
    """Inside the block, glibc keeps freed heap memory (up to :data:`KEEP_BYTES` per allocation and of
    free heap top) for the next allocation instead of unmapping it; on leaving, the free memory goes
    back to the OS (``malloc_trim``). The thresholds stay as set (glibc cannot restore its adaptive
    ones): later CPU work in the process, an evaluation say, reuses memory the same way. Yields
    whether the allocator could be tuned (False off glibc)."""
    libc = _libc()
    tuned = libc is not None and bool(
        libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
    )
    try:
        yield tuned
    finally:
        if tuned:
            libc.malloc_trim(0)


def mapped_empty(shape: tuple[int, ...] | torch.Size, dtype: torch.dtype) -> torch.Tensor:
    """An uninitialised host tensor in its own anonymous memory mapping, unmapped when the tensor is
    freed — outside the heap whatever the allocator's thresholds."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes == 0:
        return torch.empty(shape, dtype=dtype)
    flags = getattr(mmap, "MAP_PRIVATE", 0) | getattr(mmap, "MAP_ANONYMOUS", 0)  # not shared memory
    buffer = mmap.mmap(-1, nbytes, flags=flags) if flags else mmap.mmap(-1, nbytes)
    # the tensor's storage holds a reference to ``buffer``: unmapped when the tensor is freed
    return torch.frombuffer(buffer, dtype=torch.uint8).view(dtype).view(shape)


def mapped_copy(tensor: torch.Tensor, dtype: torch.dtype | None = None) -> torch.Tensor:
    """``tensor`` (on the host) copied into :func:`mapped_empty` memory, cast to ``dtype`` if given."""
    out = mapped_empty(tensor.shape, dtype or tensor.dtype)
    out.copy_(tensor)
    return out
