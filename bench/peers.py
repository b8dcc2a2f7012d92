"""Side by side with the tools users would pick instead: Torch-Pruning and NVIDIA ModelOpt against ours.

Every tool runs in its own virtual environment under the benchmark cache (``$LIAR_CACHE/peers/<tool>``,
made here on first use: torch pinned to exactly the project's version, transformers and the rest at
the project's versions, then the tool), one pruning process at a time with 2 torch threads. Each
cell is one subprocess (``bench/peers_worker/<tool>_worker.py``) that prunes, reads its peak RSS,
evaluates through the shared harness (``bench/peers_worker/common.py``: ``core.evaluation``'s
perplexity and classifier accuracy, the protocols of ``bench/criteria.py`` and ``bench/minilm.py``)
and measures prefill speed against a dense copy in the same process. The first cell of each tool and
model also evaluates the dense model, so the table shows that it is the same in every environment.

Models: SmolLM2-135M-Instruct (held-out Wikipedia perplexity) and the fine-tuned MiniLM sentiment
classifier (test accuracy). Every tool gets the same calibration samples (drawn once here through
``core.data.calibration`` with our default recipe's settings) for whatever needs data.

Finished cells are kept in ``docs/results/peers.json`` (re-running resumes; failed cells are
kept until `--retry-failed`); the table goes to ``docs/results/peers.md``.

    make bench-peers                                 # everything
    python bench/peers.py --only ours --redo         # re-measure our rows (e.g. after the default changed)
    python bench/peers.py --models smollm2 --ratios 0.2 --only torch-pruning
    python bench/peers.py --report-only
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import subprocess
import sys
import time
from importlib.metadata import version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import CACHE  # noqa: E402
from bench.common import save_json, today  # noqa: E402

OUT = ROOT / "docs" / "results" / "peers.md"
WORKERS = ROOT / "bench" / "peers_worker"
PEERS = CACHE / "peers"
RATIOS = (0.2, 0.5)
# the tools' releases measured here (PyPI), and what each needs beyond the shared stack
TOOLS = {
    "torch-pruning": {"packages": ["torch-pruning==1.6.1"], "worker": "torch_pruning_worker.py"},
    # modelopt imports requests without declaring it, and FastNAS's FLOP counter needs torchprofile
    # (whose declared torchvision would pull another torch: installed without its dependencies)
    "modelopt": {
        "packages": ["nvidia-modelopt==0.47.0", "requests"],
        "no_deps": ["torchprofile==0.0.4"],
        "worker": "modelopt_worker.py",
    },
    "ours": {"packages": [], "worker": "liar_worker.py"},
}
SHARED = ["torch", "transformers", "tokenizers", "safetensors", "huggingface_hub", "numpy", "pydantic", "PyYAML"]
TIMEOUT = {"modelopt": 3 * 3600}


def python_of(tool: str) -> Path:
    return Path(sys.executable) if tool == "ours" else PEERS / tool / "bin" / "python"


def ensure_venv(tool: str) -> Path:
    """The tool's environment, made once: torch first and exactly pinned (a constraint for every later
    install, so nothing can swap it for a CUDA build), then the shared stack at the project's versions
    and the tool; ``--no-deps`` plus its declared requirements when its own torch requirement conflicts."""
    py = python_of(tool)
    if tool == "ours":
        return py
    pins = [f"{name}=={version(name)}" for name in SHARED]
    stamp = PEERS / tool / ".installed.json"
    want = {"pins": pins, "packages": TOOLS[tool]["packages"], "no_deps": TOOLS[tool].get("no_deps", [])}
    if stamp.exists() and json.loads(stamp.read_text()) == want and py.exists():
        return py
    PEERS.mkdir(parents=True, exist_ok=True)
    if not py.exists():
        base = getattr(sys, "_base_executable", sys.executable)
        subprocess.run([base, "-m", "venv", str(PEERS / tool)], check=True)
    constraints = PEERS / tool / "constraints.txt"
    constraints.write_text(f"torch=={version('torch')}\n")
    pip = [str(py), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--find-links", "/opt/wheels"]
    subprocess.run([*pip, "-c", str(constraints), pins[0]], check=True)  # torch alone, first
    done = subprocess.run([*pip, "-c", str(constraints), *pins, *TOOLS[tool]["packages"]])
    if done.returncode:  # the tool declares a torch the pin excludes: install it alone, without its deps
        print(f"{tool}: its requirements conflict with torch=={version('torch')}; installing with --no-deps")
        subprocess.run([*pip, "-c", str(constraints), *pins], check=True)
        subprocess.run([*pip, "--no-deps", *TOOLS[tool]["packages"]], check=True)
    if want["no_deps"]:
        subprocess.run([*pip, "--no-deps", *want["no_deps"]], check=True)
    stamp.write_text(json.dumps(want))
    return py


def prepare() -> dict[str, dict]:
    """Per model: paths, kind, and the calibration samples every tool shares (saved once)."""
    import torch
    from transformers import AutoTokenizer

    from bench.assets import minilm_sentiment_dir, smollm2_dir, wikipedia_split
    from core.data.calibration import calibration_batches
    from core.spec.recipe import CalibrationConfig

    calib, evaluation = wikipedia_split()
    minilm = minilm_sentiment_dir()
    models = {
        "smollm2": {
            "kind": "decoder",
            "model_dir": str(smollm2_dir()),
            "eval_text": str(evaluation),
            # `liar prune --calibration FILE`: the defaults are the benchmarks' 128 windows × 128 tokens
            "calibration_cfg": {"dataset": str(calib)},
        },
        "minilm": {
            "kind": "encoder",
            "model_dir": str(minilm),
            "eval_records": str(minilm / "test.jsonl"),
            "score_records": str(minilm / "validation.jsonl"),
            # bench/minilm.py's calibration: 512 labelled train snippets of at most 64 tokens (`liar prune
            # --calibration train.jsonl --label-field label`: the default then uses the labels)
            "calibration_cfg": {
                "dataset": str(minilm / "train.jsonl"),
                "label_field": "label",
                "num_calibration_samples": 512,
                "max_seq_length": 64,
                "holdout_samples": 32,
            },
        },
    }
    for name, m in models.items():
        path = PEERS / f"calibration-{name}.pt"
        m["calibration"] = str(path)
        if path.exists():
            continue
        cfg = dict(m["calibration_cfg"])
        tok = AutoTokenizer.from_pretrained(m["model_dir"])
        fit, held = calibration_batches(CalibrationConfig(**cfg), tok, m["kind"])
        data = {}
        for prefix, batch in (("", fit), ("held_", held)):
            for key in ("input_ids", "attention_mask", "token_type_ids", "labels"):
                if getattr(batch, key) is not None:
                    data[prefix + key] = getattr(batch, key)
        PEERS.mkdir(parents=True, exist_ok=True)
        torch.save(data, path)
    return models


def our_recipes(model: str, m: dict, ratio: float) -> dict[str, tuple[str, dict]]:
    """``default``: what ``liar prune --model M --ratio R --calibration C`` runs (the Recipe's own
    defaults, whatever they are now); ``best``: the best measured recipe of our tables."""
    from core.spec.recipe import Recipe

    default = Recipe(model=m["model_dir"], ratio=ratio, calibration=m["calibration_cfg"])
    out = {"default": ("the default (`liar prune --ratio R`)", default.model_dump(mode="json", exclude_none=True))}
    best = default.model_dump(mode="json", exclude_none=True)
    if model == "smollm2":  # criteria.md: Kwon et al. counts + OBS selection + ls (bench/criteria.py's kwon+obs)
        from bench.assets import smollm2_recipe

        best = smollm2_recipe(Path(m["calibration_cfg"]["dataset"]), ratio, "ls", {"name": "kwon"}, allocation="global")
        best["reconstruction"]["select"] = "obs"
        label = "best measured: Kwon et al. counts + OBS selection + ls (criteria.md)"
    else:  # minilm.md: Kwon et al.'s masks + bias compensation fitted on [CLS] (bench/minilm.py --positions first)
        best.update(allocation="global", criterion={"name": "kwon", "options": {}}, round_to={"neurons": 1})
        best["reconstruction"] = {"method": "bias", "damp": 1e-3, "positions": "first", "select": "criterion"}
        label = "best measured: Kwon et al. masks + bias on [CLS] (minilm.md)"
    out["best"] = (label, Recipe.model_validate(best).model_dump(mode="json", exclude_none=True))
    return out


def cells(models: dict[str, dict], names: list[str], ratios: list[float]) -> list[dict]:
    """Every cell of the table: per model, a quick stage (our default, Torch-Pruning, Minitron) and a
    slow one (our best recipe, with gradients through the whole model; FastNAS's long search)."""
    out = []
    for model in names:
        m = models[model]
        base = {k: v for k, v in m.items() if k != "calibration_cfg"} | {"model": model}
        score = (
            "-perplexity of 4 held-aside calibration windows of 128 tokens"
            if model == "smollm2"
            else "accuracy on 256 validation snippets"
        )
        for stage in ("quick", "slow"):
            for ratio in ratios:
                ours = our_recipes(model, m, ratio)
                for variant in ("default",) if stage == "quick" else ("best",):
                    label, recipe = ours[variant]
                    out.append(
                        base
                        | {"tool": "ours", "variant": variant, "label": label, "ratio": ratio, "stage": stage}
                        | {"recipe": recipe}
                    )
                if stage == "quick":
                    for cell in tp_variants(model):
                        if model == "smollm2" and cell["variant"] == "taylor-documented":
                            continue  # the documented GQA form fails in its head grouping, whatever the importance
                        out.append(base | cell | {"tool": "torch-pruning", "ratio": ratio, "stage": stage})
                mode = "mcore_minitron" if stage == "quick" else "fastnas"
                out.append(
                    base
                    | {"tool": "modelopt", "variant": mode, "mode": mode, "ratio": ratio, "score_desc": score}
                    | {"stage": stage}
                    | {"checkpoint": str(PEERS / f"modelopt-{mode}-{model}.pth"), "label": f"ModelOpt {mode}"}
                )
    return out


def tp_variants(model: str) -> list[dict]:
    """Torch-Pruning: magnitude and Taylor importance in each structure (see the worker's docstring)."""
    if model == "smollm2":
        structures = [
            ("bottleneck", "bottleneck", {"gqa": "keep"}, True, "attention kept, FFN channels only"),
            ("groups", "width", {"gqa": "groups"}, True, "prune_llm.py, GQA declared per key/value group"),
            ("documented", "width", {"gqa": "documented"}, False, "prune_llm.py as written"),
        ]
    else:
        structures = [
            ("documented", "width", {}, True, "prune_hf_bert.py (global, heads + all widths)"),
            ("bottleneck", "bottleneck", {}, True, "prune_hf_bert.py, output projections ignored (heads + FFN)"),
        ]
    return [
        {
            "variant": f"{imp}-{name}",
            "importance": imp,
            "structure": structure,
            "knobs": dict(knobs),
            "fit": fit,
            "label": f"Torch-Pruning {imp}: {desc}",
        }
        for name, structure, knobs, fit, desc in structures
        for imp in ("magnitude", "taylor")
    ]


def key(cell: dict) -> str:
    return f"{cell['model']}|{cell['tool']}|{cell['variant']}|{cell['ratio']}"


def call_worker(cell: dict) -> dict:
    """One subprocess in the tool's environment; the last ``RESULT`` line is its row."""
    py = ensure_venv(cell["tool"])
    cmd = [str(py), str(WORKERS / TOOLS[cell["tool"]]["worker"]), json.dumps(cell)]
    env = {**os.environ, "TOKENIZERS_PARALLELISM": "false", "OMP_NUM_THREADS": "2", "PYTHONWARNINGS": "ignore"}
    t0 = time.perf_counter()
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=TIMEOUT.get(cell["tool"], 5400))
    except subprocess.TimeoutExpired as exc:
        return {"error": f"timed out after {exc.timeout:.0f} s"}
    lines = [x for x in proc.stdout.splitlines() if x.startswith("RESULT ")]
    if not lines:
        return {"error": f"worker exited {proc.returncode} without a result: {proc.stderr[-1500:]}"}
    row = json.loads(lines[-1][7:])
    row["process_seconds"] = time.perf_counter() - t0
    return row


def fit_knobs(cell: dict, state: dict) -> None:
    """Torch-Pruning's channel ratio for the target fraction of block parameters (cached per structure)."""
    fkey = f"{cell['model']}|{cell['variant'].split('-', 1)[1]}|{cell['ratio']}"
    if cell["kind"] == "encoder":  # global pruning: the widths depend on the importance
        fkey += f"|{cell['importance']}"
    if fkey not in state["fits"]:
        row = call_worker(cell | {"mode": "fit"})
        if "error" in row:
            raise RuntimeError(row["error"])
        state["fits"][fkey] = row
    cell["knobs"]["pruning_ratio"] = state["fits"][fkey]["pruning_ratio"]


def run(args) -> dict:
    path = OUT.with_suffix(".json")
    state = json.loads(path.read_text()) if path.exists() else {}
    for k in ("cells", "dense", "fits"):
        state.setdefault(k, {})
    models = prepare()
    todo = [c for c in cells(models, args.models, args.ratios) if not args.only or any(o in key(c) for o in args.only)]
    todo.sort(key=lambda c: c["stage"] == "slow")  # every model's quick cells first
    for cell in todo:
        k = key(cell)
        done = state["cells"].get(k)
        if done and "error" not in done and not args.redo:
            continue
        if done and "error" in done and not args.retry_failed and not args.redo:
            continue
        if cell["tool"] == "torch-pruning" and "pruning_ratio" not in cell["knobs"]:
            cell["knobs"]["pruning_ratio"] = cell["ratio"]
            if cell["fit"]:
                try:
                    fit_knobs(cell, state)
                except RuntimeError as exc:  # the tool cannot prune this way at all: the row says why
                    state["cells"][k] = {"error": str(exc)} | {
                        x: cell[x] for x in ("label", "model", "tool", "variant")
                    }
                    state["cells"][k].update(ratio=cell["ratio"], date=today())
                    save_json(path, state)
                    continue
        env_key = f"{cell['model']}|{cell['tool']}"
        cell["dense_eval"] = env_key not in state["dense"]
        print(f"[{dt.datetime.now():%H:%M:%S}] {k} ...", flush=True)
        row = call_worker(cell)
        row.update(label=cell["label"], model=cell["model"], tool=cell["tool"], variant=cell["variant"])
        row.update(ratio=cell["ratio"], date=today())
        if "dense" in row:
            state["dense"][env_key] = row.pop("dense") | {"env": row.get("env")}
        state["cells"][k] = row
        print(
            "   ", {x: row.get(x) for x in ("perplexity", "accuracy", "removed", "prune_seconds", "error")}, flush=True
        )
        save_json(path, state)
    return state


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["smollm2", "minilm"], choices=["smollm2", "minilm"])
    p.add_argument("--ratios", nargs="*", type=float, default=list(RATIOS))
    p.add_argument(
        "--only", nargs="*", help="run only cells whose key (model|tool|variant|ratio) contains one of these"
    )
    p.add_argument("--redo", action="store_true", help="re-run the selected cells even if finished")
    p.add_argument("--retry-failed", action="store_true", help="re-run selected cells that failed before")
    p.add_argument("--report-only", action="store_true")
    args = p.parse_args()
    from bench.peers_report import write_report

    state = json.loads(OUT.with_suffix(".json").read_text()) if args.report_only else run(args)
    every = [key(c) for c in cells(prepare(), ["smollm2", "minilm"], list(RATIOS))]
    write_report(state, OUT, pending=[k for k in every if k not in state["cells"]])
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
