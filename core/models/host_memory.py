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

So the policy follows what the run is for. A run that must bound its memory maps every allocation
above :data:`STREAM_MMAP_BYTES` (:func:`release_freed_memory`) and pays in page faults; one that
need not keeps freed memory for reuse (:func:`keep_freed_memory`, :func:`reuse_freed_memory`). An
in-memory run holds the whole model anyway: it reuses. A streamed run bounds its memory when it was
asked to stream (``execution: stream``), on a GPU worker (whose activations are on the device), or
when its weights exceed :data:`REUSE_SHARE` of the memory available (:func:`bounds_memory`);
otherwise — a small model streamed because ``execution: auto`` streams every checkpoint — it reuses:
SmolLM2-135M's default recipe on 2 cores took 92.0 s streamed with every allocation mapped (27 M page
faults, peak RSS 717 MB), 57.9 s reusing (0.5 M faults, 947 MB) and 56.2 s in memory (1,313 MB).
On a TinyLlama-1.1B-shaped checkpoint (4.4 GB in float32, magnitude, 16 windows) reusing saved
nothing (220.4 s against 221.5 s: the solves dominate) and peaked at 4.45 GB against 1.33 GB.
Either way a streamed block's weights are read into their own anonymous mappings
(:func:`mapped_empty`), outside the heap, freed with the block whatever the thresholds.

glibc's thresholds belong to the process, and glibc cannot restore its adaptive ones, so the
policy is applied only where an application opted in with :func:`configure` (the ``liar`` CLI, a
job worker). A library caller's ``core.prune`` leaves the allocator as it found it: the functions
below then change nothing and say so (False); the run is correct either way — the weights' own
mappings still bound a streamed run, freed activations are only faulted in more often.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import functools
import math
import mmap
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import torch

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc mallopt parameters
KEEP_BYTES = 256 * 2**20  # in memory: allocations up to this come from the heap, this much free heap top is kept
STREAM_MMAP_BYTES = 64 * 2**10  # bounded: every allocation above this is its own mapping
TRIM_BYTES = 128 * 2**10  # bounded: free heap top above this goes back to the OS (glibc's default)
# a streamed CPU run reuses freed memory while its weights are at most this share of the memory available:
# its peak is then far below an in-memory run's, which holds every weight (135M: 947 vs 1,313 MB)
REUSE_SHARE = 1 / 8


_policy = {"tune": False}  # whether this process's application let runs tune glibc's malloc


def configure(tune: bool = True) -> None:
    """An application's choice for its process: runs may set glibc's malloc thresholds (the policy
    above) — or, ``tune`` False, never (the default for a process that never calls this)."""
    _policy["tune"] = bool(tune)


def tunes() -> bool:
    """Whether runs in this process apply the allocator policy (:func:`configure`)."""
    return _policy["tune"]


def _allocator():
    """glibc, when the application let runs tune it; else None (nothing is changed)."""
    return _libc() if _policy["tune"] else None


@functools.cache
def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        libc.mallopt, libc.malloc_trim  # noqa: B018 — both must exist (glibc)
    except (OSError, AttributeError):  # not glibc: the platform's allocator is left as it is
        return None
    return libc


def release_freed_memory() -> bool:
    """A bounded streamed run's policy: every allocation above :data:`STREAM_MMAP_BYTES` is its own
    mapping, so freed memory goes back to the OS at once and the resident set stays near one block's
    worth; the heap's free top is trimmed at glibc's default again, and what an earlier run in the
    process (a worker's last job) left free is given back now. Stays set after the run (until a run
    that reuses changes it); False off glibc or when the application did not opt in (:func:`configure`)."""
    libc = _allocator()
    if libc is None:
        return False
    tuned = bool(libc.mallopt(_M_MMAP_THRESHOLD, STREAM_MMAP_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, TRIM_BYTES))
    libc.malloc_trim(0)
    return tuned


def keep_freed_memory() -> bool:
    """glibc keeps freed heap memory (up to :data:`KEEP_BYTES` per allocation and of free heap top) for
    the next allocation instead of unmapping it. Stays set (glibc cannot restore its adaptive
    thresholds): later CPU work in the process, an evaluation say, reuses memory the same way. False
    off glibc or when the application did not opt in (:func:`configure`)."""
    libc = _allocator()
    return libc is not None and bool(
        libc.mallopt(_M_MMAP_THRESHOLD, KEEP_BYTES) and libc.mallopt(_M_TRIM_THRESHOLD, KEEP_BYTES)
    )


@contextmanager
def reuse_freed_memory() -> Iterator[bool]:
    """:func:`keep_freed_memory` inside the block; on leaving, the free memory goes back to the OS
    (``malloc_trim``). Yields whether the allocator was tuned (False off glibc or without
    :func:`configure`: then nothing is changed)."""
    tuned = keep_freed_memory()
    try:
        yield tuned
    finally:
        if tuned:
            _libc().malloc_trim(0)


def available_memory(proc: Path = Path("/proc"), cgroups: Path = Path("/sys/fs/cgroup")) -> int | None:
    """Bytes of host memory this process can still take: the kernel's ``MemAvailable``, lowered to
    what the memory limit of its cgroup leaves (a worker in a container, or a service with a memory
    cap); None where neither can be read."""
    found = []
    try:
        for line in (proc / "meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                found.append(int(line.split()[1]) * 1024)
    except (OSError, ValueError, IndexError):
        pass
    # the process's own group (the root inside a container's cgroup namespace): cgroup v2's unified
    # hierarchy ("0::/path"), or v1's memory controller ("4:memory:/path")
    v2, v1 = cgroups, cgroups / "memory"
    try:
        for line in (proc / "self" / "cgroup").read_text().splitlines():
            _, controllers, path = line.split(":", 2)
            if controllers == "":
                v2 = cgroups / path.strip().lstrip("/")
            elif "memory" in controllers.split(","):
                v1 = cgroups / "memory" / path.strip().lstrip("/")
    except (OSError, ValueError):
        pass
    for limit, usage in (
        (v2 / "memory.max", v2 / "memory.current"),
        (v1 / "memory.limit_in_bytes", v1 / "memory.usage_in_bytes"),
    ):
        try:
            cap, used = limit.read_text().strip(), usage.read_text().strip()
            if cap != "max" and int(cap) < 2**60:  # v1 writes "no limit" as a huge number
                found.append(max(0, int(cap) - int(used)))
        except (OSError, ValueError):
            pass
    return min(found) if found else None


def bounds_memory(weight_bytes: int, device: torch.device, available: int | None) -> bool:
    """Whether a streamed run of ``weight_bytes`` of weights bounds its host memory (maps every
    allocation, :func:`release_freed_memory`) rather than reusing freed memory: always on a GPU worker
    (the activations live on the device; the host holds block reads and pinned buffers) and where the
    available memory is unknown; on a CPU, when the weights exceed :data:`REUSE_SHARE` of
    ``available``."""
    if torch.device(device).type != "cpu" or available is None:
        return True
    return weight_bytes > REUSE_SHARE * available


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
