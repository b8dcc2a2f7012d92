"""A child process's peak resident memory (sampled from /proc), and a checkpoint's files: their bytes,
their eviction from the page cache, their read throughput. Used by ``bench/streaming.py``."""

from __future__ import annotations

import os
import subprocess
import threading
import time
from pathlib import Path

MB = 2**20


def dir_bytes(path: Path) -> int:
    return sum(p.stat().st_size for p in Path(path).rglob("*") if p.is_file())


def weight_files(path: Path) -> list[Path]:
    return sorted(Path(path).glob("*.safetensors"))


def evict(path: Path) -> None:
    """Drop the checkpoint's files from the page cache (fsync first: dirty pages are not dropped)."""
    for f in weight_files(path):
        fd = os.open(f, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def read_throughput(path: Path, chunk: int = 16 * MB) -> dict:
    """Sequential read MB/s of the weight files: cold (after eviction) and warm (again, from the cache)."""
    out = {}
    for label in ("cold", "warm"):
        if label == "cold":
            evict(path)
        total, t0 = 0, time.perf_counter()
        for f in weight_files(path):
            with open(f, "rb", buffering=0) as fh:
                buf = bytearray(chunk)
                view = memoryview(buf)
                while n := fh.readinto(view):
                    total += n
        seconds = time.perf_counter() - t0
        out[f"read_{label}_mb_s"] = round(total / MB / seconds, 1) if seconds > 0 else None
        out[f"read_{label}_s"] = round(seconds, 2)
    return out


_RSS_FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem")


class RssSampler(threading.Thread):
    """Polls /proc/PID/status: the largest sampled VmRSS, its anonymous / file-backed split, and when.

    Sampling can miss a short spike (``os.wait4``'s ``ru_maxrss`` is the exact peak); it tells whether the
    peak is heap (RssAnon) or mapped checkpoint pages (RssFile), and at which second of the run it came.
    """

    def __init__(self, pid: int, interval: float = 0.05):
        super().__init__(daemon=True)
        self.pid, self.interval, self.t0 = pid, interval, time.perf_counter()
        self.peak = {"rss": 0, "anon": 0, "file": 0, "at_s": 0.0}
        self.max_anon = self.max_file = 0
        self.timeline: list[tuple[float, float, float]] = []  # (s, RSS MB, anon MB), about once a second
        self.done = threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            try:
                fields = dict(line.split(":", 1) for line in Path(f"/proc/{self.pid}/status").read_text().splitlines())
                rss, anon, file, shmem = (int(fields.get(k, "0 kB").split()[0]) for k in _RSS_FIELDS)
                file += shmem
            except (OSError, ValueError):
                return
            self.max_anon, self.max_file = max(self.max_anon, anon), max(self.max_file, file)
            now = time.perf_counter() - self.t0
            if not self.timeline or now - self.timeline[-1][0] >= 1.0:
                self.timeline.append((round(now, 1), round(rss / 1024, 1), round(anon / 1024, 1)))
            if rss > self.peak["rss"]:
                self.peak = {"rss": rss, "anon": anon, "file": file, "at_s": time.perf_counter() - self.t0}
            self.done.wait(self.interval)

    def result(self) -> dict:
        mb = lambda kb: round(kb / 1024, 1)  # noqa: E731
        return {
            "sampled_peak_rss_mb": mb(self.peak["rss"]),
            "sampled_peak_anon_mb": mb(self.peak["anon"]),
            "sampled_peak_file_mb": mb(self.peak["file"]),
            "sampled_peak_at_s": round(self.peak["at_s"], 1),
            "max_anon_mb": mb(self.max_anon),
            "max_file_mb": mb(self.max_file),
            "rss_timeline": self.timeline,
        }


def run_measured(cmd: list[str], timeout: float, env: dict, cwd: Path) -> dict:
    """Run ``cmd``; its own peak RSS from ``os.wait4`` (this child only), wall time, stdout, stderr."""
    import tempfile

    with tempfile.TemporaryFile("w+") as out, tempfile.TemporaryFile("w+") as err:
        t0 = time.perf_counter()
        proc = subprocess.Popen(cmd, stdout=out, stderr=err, env=env, cwd=cwd)
        sampler = RssSampler(proc.pid)
        sampler.start()
        killed = []
        timer = threading.Timer(timeout, lambda: (killed.append(True), proc.kill()))
        timer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            timer.cancel()
            sampler.done.set()
            sampler.join()
        wall = time.perf_counter() - t0
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here: Popen must not wait again
        out.seek(0)
        err.seek(0)
        return {
            "rc": proc.returncode,
            "timed_out": bool(killed),
            "wall_s": round(wall, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024, 1),  # KiB on Linux
            "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "load_avg_1m_at_end": round(os.getloadavg()[0], 2),
            "rss_profile": sampler.result(),
            "stdout": out.read(),
            "stderr": err.read(),
        }
