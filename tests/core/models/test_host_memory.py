"""Host memory of a CPU run: mapped block weights leave with their tensor; transients reuse the heap."""

import resource
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from core.models import host_memory
from core.models.host_memory import REUSE_SHARE, available_memory, bounds_memory, mapped_copy, mapped_empty
from core.models.safetensors_io import CheckpointReader, write_shard

MB = 2**20
ROOT = Path(__file__).resolve().parents[3]


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / MB


def test_a_mapped_tensor_is_an_ordinary_tensor_and_its_memory_leaves_with_it():
    t = mapped_empty((2048, 8192), torch.float32)  # 64 MB
    assert t.shape == (2048, 8192) and t.dtype == torch.float32 and t.is_contiguous()
    before = _rss_mb()
    t.fill_(3.0)
    assert _rss_mb() - before > 60  # the pages exist once written
    part = t[:2].clone()
    del t
    assert _rss_mb() - before < 8  # unmapped with the tensor, not kept by any allocator
    assert torch.equal(part, torch.full((2, 8192), 3.0))
    assert mapped_empty((0, 5), torch.bfloat16).shape == (0, 5)


def test_a_mapped_copy_casts_exactly():
    x = torch.randn(7, 5, dtype=torch.float64).to(torch.bfloat16)
    assert torch.equal(mapped_copy(x, torch.float32), x.float())
    assert torch.equal(mapped_copy(x), x) and mapped_copy(x).dtype == torch.bfloat16


def test_tensors_read_from_a_checkpoint_are_mapped_and_equal(tmp_path):
    w = torch.randn(64, 32).to(torch.bfloat16)
    write_shard(tmp_path / "model.safetensors", [("w", w)])
    reader = CheckpointReader(tmp_path)
    host = reader.read_host("w")
    assert torch.equal(host, w)
    assert torch.equal(reader.read("w", "cpu", torch.float32), w.float())
    with open("/proc/self/maps") as f:  # the buffer is a mapping of its own (anonymous, no file)
        spans = [line.split() for line in f]
    ptr = host.data_ptr()
    own = [s for s in spans if int(s[0].split("-")[0], 16) <= ptr < int(s[0].split("-")[1], 16)]
    assert own and len(own[0]) == 5  # address, perms, offset, device, inode: no path


_CHURN = """
import ctypes, resource, torch
from torch.nn.functional import linear, silu
from core.models.host_memory import configure, reuse_freed_memory

configure(True)  # as the liar CLI and the job worker do: runs may tune glibc's malloc
def churn():  # one batch's FFN activations (12 MB tensors), computed and freed again and again
    x, w = torch.randn(2048, 576), torch.randn(1536, 576)
    start = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(40):
        y = linear(x, w)
        z = silu(y) * y
        del y, z
    return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - start) * resource.getpagesize() / 2**20

ctypes.CDLL("libc.so.6").mallopt(-3, 65536)  # every allocation above 64 KiB its own mapping
plain = churn()
with reuse_freed_memory() as tuned:
    reused = churn()
print(tuned, plain, reused)
"""


@pytest.mark.slow
def test_inside_a_run_freed_activations_are_reused_not_faulted_in_again():
    """In a fresh process where glibc maps every allocation above 64 KiB on its own, each activation
    is faulted in again (40 × 3 × 12 MB); inside :func:`reuse_freed_memory` the heap serves them from
    memory already there (measured: under a tenth of the pages)."""
    out = subprocess.run([sys.executable, "-c", _CHURN], capture_output=True, text=True, check=True, cwd=ROOT)
    tuned, plain, reused = out.stdout.split()
    if tuned != "True":
        pytest.skip("not glibc: the allocator is left as the platform has it")
    assert float(plain) > 1000  # MB faulted in without reuse
    assert float(reused) < float(plain) / 4, out.stdout


def test_without_an_application_s_consent_the_allocator_is_left_alone(monkeypatch):
    """A library caller's process: the policy functions change nothing and say so."""
    calls = []

    class Libc:
        def mallopt(self, *args):
            calls.append(args)
            return 1

        malloc_trim = mallopt

    monkeypatch.setattr(host_memory, "_libc", lambda: Libc())
    monkeypatch.setattr(host_memory, "_policy", {"tune": False})
    assert not host_memory.release_freed_memory() and not host_memory.keep_freed_memory()
    with host_memory.reuse_freed_memory() as tuned:
        assert not tuned
    assert calls == [] and not host_memory.tunes()
    host_memory.configure(True)
    assert host_memory.keep_freed_memory() and host_memory.release_freed_memory() and calls


def test_a_streamed_run_bounds_memory_on_a_gpu_for_big_weights_or_when_memory_is_unknown():
    cpu, gpu, gib = torch.device("cpu"), torch.device("cuda"), 2**30
    assert not bounds_memory(1 * gib, cpu, 16 * gib)  # 1/16 of the memory available: reuse
    assert not bounds_memory(int(REUSE_SHARE * 16 * gib), cpu, 16 * gib)  # at the share: still reuse
    assert bounds_memory(int(REUSE_SHARE * 16 * gib) + 1, cpu, 16 * gib)
    assert bounds_memory(4 * gib, cpu, 24 * gib)  # TinyLlama-1.1B in float32 on a 24 GB machine
    assert bounds_memory(1, gpu, 16 * gib)  # a GPU worker's host holds block reads and pinned buffers
    assert bounds_memory(1, cpu, None)


def test_available_memory_is_what_the_kernel_reports_at_most():
    available = available_memory()
    if available is None:
        pytest.skip("no /proc/meminfo and no cgroup memory files here")
    with open("/proc/meminfo") as f:
        meminfo = {line.split(":")[0]: int(line.split()[1]) * 1024 for line in f}
    assert 0 < available <= meminfo["MemAvailable"] + 64 * MB  # a moment apart: allow for other processes


_AFTER_REUSE = """
import resource
import torch
from core.models.host_memory import configure, keep_freed_memory, release_freed_memory

configure(True)  # as the liar CLI and the job worker do

def rss_mb():
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20

keep_freed_memory()  # a run that reuses freed memory (a small model streamed by auto) ...
base = rss_mb()
held = [torch.ones(2**20 // 4) for _ in range(256)]  # 256 MB in 1 MB heap allocations
del held
kept = rss_mb() - base
release_freed_memory()  # ... then one that bounds memory, in the same worker process
print(kept, rss_mb() - base)
"""


def test_bounding_memory_gives_back_what_an_earlier_reusing_run_kept():
    out = subprocess.run([sys.executable, "-c", _AFTER_REUSE], capture_output=True, text=True, check=True, cwd=ROOT)
    kept, after = map(float, out.stdout.split())
    if kept < 200:
        pytest.skip("not glibc, or its heap gave the memory back by itself")
    assert after < 32, out.stdout


def test_available_memory_is_lowered_to_what_the_cgroup_limit_leaves(tmp_path):
    proc, cgroups = tmp_path / "proc", tmp_path / "cgroup"
    (proc / "self").mkdir(parents=True)
    (proc / "meminfo").write_text("MemTotal:       33554432 kB\nMemAvailable:   16777216 kB\n")  # 16 GiB
    assert available_memory(proc, cgroups) == 16 * 2**30  # no cgroup files: the kernel's figure
    (proc / "self" / "cgroup").write_text("0::/system.slice/liar-worker.service\n")
    group = cgroups / "system.slice" / "liar-worker.service"
    group.mkdir(parents=True)
    (group / "memory.max").write_text(f"{4 * 2**30}\n")  # a service capped at 4 GiB, 1 GiB of it in use
    (group / "memory.current").write_text(f"{2**30}\n")
    assert available_memory(proc, cgroups) == 3 * 2**30
    (group / "memory.max").write_text("max\n")  # no cap
    assert available_memory(proc, cgroups) == 16 * 2**30
    (proc / "self" / "cgroup").write_text("5:cpu,cpuacct:/\n4:memory:/docker/abc\n0::/\n")  # cgroup v1
    v1 = cgroups / "memory" / "docker" / "abc"
    v1.mkdir(parents=True)
    (v1 / "memory.limit_in_bytes").write_text(f"{2 * 2**30}\n")
    (v1 / "memory.usage_in_bytes").write_text(f"{2**29}\n")
    assert available_memory(proc, cgroups) == 3 * 2**29
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # how v1 writes "no limit"
    assert available_memory(proc, cgroups) == 16 * 2**30
    assert available_memory(tmp_path / "none", tmp_path / "none") is None
