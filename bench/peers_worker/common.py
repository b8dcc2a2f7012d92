"""What every peer's worker shares: loading, parameter counts, the one evaluation, speed, the harness.

A worker runs in its tool's own virtual environment (``bench/peers.py`` makes them), which holds
torch, transformers, pydantic and PyYAML at the project's exact versions plus the tool. It imports
this module with the repository on ``sys.path`` and evaluates through ``core.evaluation`` — the
functions ``bench/criteria.py`` and ``bench/minilm.py`` use — so every number of the table comes
from the same code.

A worker is started as ``<venv>/bin/python bench/peers_worker/<tool>.py '<cell JSON>'`` and prints
one line ``RESULT {...}``. Order inside the process: prune (timed, peak RSS read right after) →
evaluate the pruned model → prefill speed of pruned and a fresh dense copy, interleaved →
(when asked) evaluate the dense model, so the table can check it is the same in every environment.
"""

from __future__ import annotations

import json
import os
import platform
import resource
import statistics
import sys
import time
import traceback
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch import nn  # noqa: E402

THREADS = 2
SPEED_BATCH, SPEED_LEN = 8, 128


def setup() -> None:
    torch.set_num_threads(THREADS)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    torch.manual_seed(0)


def load_dense(cell: dict) -> tuple[nn.Module, Any]:
    """The dense model of the cell (float32, CPU, eval mode) and its tokenizer."""
    from transformers import AutoModelForCausalLM, AutoModelForSequenceClassification, AutoTokenizer

    cls = AutoModelForCausalLM if cell["kind"] == "decoder" else AutoModelForSequenceClassification
    model = cls.from_pretrained(cell["model_dir"], dtype=torch.float32).eval()
    tok = AutoTokenizer.from_pretrained(cell["model_dir"])
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    return model, tok


def blocks(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks: the module list with one entry per hidden layer."""
    n = model.config.num_hidden_layers
    for module in model.modules():
        if isinstance(module, nn.ModuleList) and len(module) == n:
            return module
    raise ValueError(f"no list of {n} transformer blocks in {type(model).__name__}")


def ffn_width(layer: nn.Module, kind: str) -> int:
    """A block's FFN width (the decoder's gate projection, the encoder's intermediate layer)."""
    return layer.mlp.gate_proj.out_features if kind == "decoder" else layer.intermediate.dense.out_features


def count_params(model: nn.Module) -> dict[str, int]:
    """Total parameters (a tied head counted once) and the transformer blocks' parameters."""
    total = sum(p.numel() for p in {id(p): p for p in model.parameters()}.values())
    block = sum(p.numel() for p in blocks(model).parameters())
    return {"params": total, "block_params": block}


def calibration(cell: dict) -> dict[str, torch.Tensor]:
    """The calibration samples ``bench/peers.py`` drew once through ``core.data.calibration`` with our
    recipe's settings: ``input_ids`` / ``attention_mask`` (+ ``labels`` for the classifier) of the fit
    samples, and ``held_*`` of the held-aside ones."""
    return torch.load(cell["calibration"], weights_only=True)


def batches(calib: dict[str, torch.Tensor], size: int, prefix: str = "") -> list[dict[str, torch.Tensor]]:
    """Calibration samples as model inputs in batches of ``size``."""
    keys = [k for k in ("input_ids", "attention_mask", "token_type_ids", "labels") if prefix + k in calib]
    n = calib[prefix + "input_ids"].shape[0]
    return [{k: calib[prefix + k][i : i + size] for k in keys} for i in range(0, n, size)]


def evaluate(model: nn.Module, tok: Any, cell: dict) -> dict[str, float]:
    """THE evaluation of every row: held-out perplexity (decoders; the protocol of ``bench/criteria.py``:
    the first 20 windows of 512 tokens of the evaluation articles) or test accuracy (the classifier;
    the protocol of ``bench/minilm.py``: 1,275 test snippets, at most 64 tokens)."""
    from core.evaluation.encoder import evaluate_classifier
    from core.evaluation.perplexity import perplexity

    model.eval()
    with torch.no_grad():
        if cell["kind"] == "decoder":
            ppl = perplexity(model, tok, cell["eval_text"], seq_len=512, batch_size=4, max_windows=20)
            return {"perplexity": ppl["perplexity"]}
        records = [json.loads(x) for x in Path(cell["eval_records"]).read_text().splitlines() if x.strip()]
        acc = evaluate_classifier(model, tok, records, batch_size=128, max_length=64)
        return {"accuracy": acc["accuracy"]}


def _speed_inputs(kind: str) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    ids = torch.randint(1000, 20000, (SPEED_BATCH, SPEED_LEN), generator=gen)
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids)}
    if kind == "decoder":
        inputs["use_cache"] = False
    return inputs


@torch.no_grad()
def prefill_speed(pruned: nn.Module, dense: nn.Module, kind: str, reps: int = 7) -> dict[str, float]:
    """Tokens/s of one forward pass over 8 × 128 tokens (2 threads), pruned and dense interleaved so
    that load on the shared machine hits both alike; median of ``reps`` after a warm-up."""
    times: dict[str, list[float]] = {"pruned": [], "dense": []}
    models = {"pruned": pruned, "dense": dense}
    inputs = {k: _speed_inputs(kind) for k in models}
    for k, m in models.items():
        m(**inputs[k])
    for _ in range(reps):
        for k, m in models.items():
            t0 = time.perf_counter()
            m(**inputs[k])
            times[k].append(time.perf_counter() - t0)
    tokens = SPEED_BATCH * SPEED_LEN
    speed = {k: tokens / statistics.median(v) for k, v in times.items()}
    return {
        "prefill_tokens_s": speed["pruned"],
        "dense_prefill_tokens_s": speed["dense"],
        "speedup": speed["pruned"] / speed["dense"],
    }


def peak_rss_mb() -> float:
    """This process's peak resident memory so far (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def environment(tool_packages: list[str]) -> dict[str, str]:
    names = ["torch", "transformers", *tool_packages]
    return {"python": platform.python_version(), **{n: version(n) for n in names}}


def run(cell: dict, prune: Callable[[dict], dict], tool_packages: list[str]) -> None:
    """The harness: ``prune(cell)`` returns ``{"model", "tokenizer", "knobs"}`` (and may set
    ``"dense_params"``); everything around it is measured here, the same for every tool."""
    setup()
    row: dict[str, Any] = {"env": environment(tool_packages)}
    try:
        t0 = time.perf_counter()
        out = prune(cell)
        row["prune_seconds"] = time.perf_counter() - t0
        row["peak_rss_mb"] = peak_rss_mb()
        model, tok = out["model"], out["tokenizer"]
        row["knobs"] = out.get("knobs", {})
        after = count_params(model)
        dense, dense_tok = load_dense(cell)
        before = count_params(dense)
        row.update(
            params_before=before["params"],
            params_after=after["params"],
            block_params_before=before["block_params"],
            block_params_after=after["block_params"],
            removed=1 - after["block_params"] / before["block_params"],
            removed_total=1 - after["params"] / before["params"],
        )
        row.update(evaluate(model, tok, cell))
        row.update(prefill_speed(model, dense, cell["kind"]))
        if cell.get("dense_eval"):
            row["dense"] = evaluate(dense, dense_tok, cell)
    except Exception as exc:  # the row says why; the table shows it
        row["error"] = f"{type(exc).__name__}: {exc}"
        row["traceback"] = traceback.format_exc()[-4000:]
    print("RESULT " + json.dumps(row), flush=True)


def main(prune: Callable[[dict], dict], tool_packages: list[str]) -> None:
    run(json.loads(sys.argv[1]), prune, tool_packages)
