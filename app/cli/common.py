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
    """The engine's process-wide choices (``core/process.py``), made once before a verb runs it;
    returns an error sentence (an unknown ``LIAR_CPU_MATMUL``), or None."""
    from core.process import configure_engine

    try:
        configure_engine()
    except ValueError as exc:
        return str(exc)
    return None


# what a perplexity evaluation reports (``core.evaluate``'s result, less the parameter count)
PERPLEXITY_KEYS = ("perplexity", "nll", "tokens", "windows", "seq_len")


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
