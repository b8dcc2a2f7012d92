"""The process-wide choices an application makes for the engine before it runs it — the ``liar``
command, a job worker, a benchmark; a library caller of ``core`` gets neither:

- float32 CPU products through oneDNN where ``LIAR_CPU_MATMUL`` (default ``auto``: where a one-time
  timing on this CPU finds it faster) says so (``core/kernels/cpu_matmul.py``);
- glibc's malloc thresholds tuned to each run (``core/models/host_memory.py``).
"""

from __future__ import annotations

from core.kernels import cpu_matmul
from core.models import host_memory


def configure_engine(matmul: str | None = None) -> None:
    """Make both choices for this process (``matmul`` None: ``LIAR_CPU_MATMUL``). Raises ValueError, in
    one sentence, for an unknown matmul choice; cheap (the timing runs at first use)."""
    cpu_matmul.configure(matmul)
    host_memory.configure(True)
