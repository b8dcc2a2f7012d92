"""What every verb shares: the error line and exit code, and running a chatty library quietly."""

from __future__ import annotations

import os
import sys

EXIT_USAGE = 2
DTYPES = ["auto", "float32", "float16", "bfloat16"]  # the --dtype choices


def fail(message: str) -> int:
    """Print ``liar: error: MESSAGE`` on stderr; returns the usage exit code for the verb to return."""
    print(f"liar: error: {message}", file=sys.stderr)
    return EXIT_USAGE


def quiet_transformers() -> None:
    """No download progress bars or warnings from transformers (the engine verbs print their own lines)."""
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()


def configure_engine() -> str | None:
    """The process-wide choices the ``liar`` application makes for the engine, once, before a verb
    runs it (a library caller of ``core`` gets neither): float32 CPU products through oneDNN where
    ``LIAR_CPU_MATMUL`` (default ``auto``: where a timing on this CPU finds it faster) says so, and
    glibc's malloc thresholds tuned to each run (``core/models/host_memory.py``). Returns an error
    sentence, or None."""
    from core.kernels import cpu_matmul
    from core.models import host_memory

    try:
        cpu_matmul.configure()
    except ValueError as exc:
        return str(exc)
    host_memory.configure(True)
    return None


def run_quietly(quiet: bool, fn, *args, **kwargs):
    """Call ``fn``; when ``quiet``, the harness's progress bars and log lines go nowhere (stdout stays JSON)."""
    if not quiet:
        return fn(*args, **kwargs)
    import contextlib
    import logging

    logger = logging.getLogger("lm_eval")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        with open(os.devnull, "w") as sink, contextlib.redirect_stdout(sink), contextlib.redirect_stderr(sink):
            return fn(*args, **kwargs)
    finally:
        logger.setLevel(level)
