"""Where the serving engines live, and calls into them.

Each engine runs in a Python environment of its own, never the project's (their pins differ from
ours): ``liar engines install llama.cpp`` makes ``$LIAR_CACHE/engines/llama-cpp``. This module only
finds an environment and talks to it through ``llama_cpp_worker.py`` in a subprocess:

1. ``$LIAR_LLAMA_CPP_PYTHON``, a Python that imports ``llama_cpp``;
2. this interpreter, when ``llama_cpp`` is importable here;
3. the environment ``liar engines install`` made.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

WORKER = Path(__file__).with_name("llama_cpp_worker.py")
LLAMA_CPP_VERSION = "0.3.36"  # llama-cpp-python release whose vendored llama.cpp has the per-layer `deci` model
INSTALL_HINT = "install it with `liar engines install llama.cpp` (builds llama-cpp-python once, about 10 minutes)"


class EngineError(RuntimeError):
    """An engine is missing or failed (the message says which and what to do)."""


def cache_dir() -> Path:
    return Path(os.environ.get("LIAR_CACHE", Path.home() / ".cache" / "liar")).expanduser()


def engine_dir(name: str) -> Path:
    return cache_dir() / "engines" / name


def llama_cpp_python() -> str | None:
    """A Python that imports ``llama_cpp``, or None."""
    explicit = os.environ.get("LIAR_LLAMA_CPP_PYTHON")
    if explicit:
        return explicit
    if importlib.util.find_spec("llama_cpp") is not None:
        return sys.executable
    py = engine_dir("llama-cpp") / "bin" / "python"
    return str(py) if py.exists() else None


def call_llama_cpp(request: dict, timeout: float | None = None) -> dict:
    """Run one worker request (see ``llama_cpp_worker``); ``EngineError`` with llama.cpp's own message."""
    py = llama_cpp_python()
    if py is None:
        raise EngineError(f"llama.cpp is not installed: {INSTALL_HINT}")
    try:
        done = subprocess.run(
            [py, str(WORKER), json.dumps(request)], capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired:
        raise EngineError(f"llama.cpp did not answer {request['op']!r} within {timeout:.0f} s") from None
    lines = done.stdout.strip().splitlines()
    try:
        answer = json.loads(lines[-1])
    except (IndexError, json.JSONDecodeError):
        tail = (done.stderr.strip().splitlines() or ["no output"])[-1]
        raise EngineError(f"llama.cpp failed on {request['op']!r} (exit {done.returncode}): {tail}") from None
    if not answer.get("ok"):
        raise EngineError(f"llama.cpp refused {request['op']!r}: {answer.get('error') or answer}")
    return answer
