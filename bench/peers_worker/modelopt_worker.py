"""NVIDIA ModelOpt (``nvidia-modelopt`` on PyPI): FastNAS on the Hugging Face models, and Minitron's refusal.

Runs in the ModelOpt environment made by ``bench/peers.py``. FastNAS (``mtp.prune(mode="fastnas")``)
turns every prunable ``nn.Linear`` output into a searchable width (ModelOpt's defaults: 5–100% in
steps of 5%, multiples of 32), measures how much the score drops for every width of every layer
(the "sensitivity map", one score evaluation per choice) and binary-searches a threshold on it
that meets the parameter budget. The budget is the dense parameter count less the target fraction
of the block parameters (``constraints={"params": N}``). For a small budget the docs ask for a
cheap score function on a subsample: here the negative perplexity of 4 of the held-aside calibration
windows (SmolLM2) or the accuracy on 256 validation snippets (MiniLM) — never the evaluation split.
The sensitivity map is kept in ModelOpt's search checkpoint (``config["checkpoint"]``), so the
second ratio of a model reuses it, as ModelOpt's docs describe.

Minitron (``mode="mcore_minitron"``) is called the same way; ModelOpt documents it as "required
to prune NVIDIA Megatron-Core GPT or Mamba models", and the row records what it raises on a plain
Hugging Face model.
"""

from __future__ import annotations

import json
import math
import sys
import warnings
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import torch  # noqa: E402

warnings.filterwarnings("ignore", message=".*transformers.*not tested.*")


def _score_func(cell: dict, tok):
    calib = common.calibration(cell)
    if cell["kind"] == "decoder":
        held = calib["held_input_ids"][:4]  # a subsample, as the docs advise for a short search

        @torch.no_grad()
        def score(model) -> float:
            logits = model(held).logits.float()
            nll = torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), held[:, 1:].flatten())
            return -math.exp(nll.item())  # maximised: minus the perplexity

        return score
    from core.evaluation.encoder import evaluate_classifier

    rows = [json.loads(x) for x in Path(cell["score_records"]).read_text().splitlines() if x.strip()][:256]

    def score(model) -> float:
        return evaluate_classifier(model, tok, rows, batch_size=128, max_length=64)["accuracy"]

    return score


def prune(cell: dict) -> dict:
    import modelopt.torch.prune as mtp

    model, tok = common.load_dense(cell)
    before = common.count_params(model)
    # ModelOpt's params constraint counts a tied weight once per module that holds it (SmolLM2's
    # embedding again as lm_head: 162.8M against 134.5M), so the budget is set in its own count
    counted = sum(p.numel() for m in model.modules() for p in m.parameters(recurse=False))
    budget = int(counted - cell["ratio"] * before["block_params"])
    calib = common.calibration(cell)
    loader = common.batches(calib, 8)
    dummy = calib["input_ids"][:1]
    config = {
        "data_loader": loader,
        "collect_func": lambda batch: batch["input_ids"],
        "max_iter_data_loader": 4,
        "score_func": _score_func(cell, tok),
        "checkpoint": cell["checkpoint"],
        "verbose": False,
    }
    if cell["mode"] == "mcore_minitron":
        config = {"forward_loop": lambda m: [m(b["input_ids"]) for b in loader[:2]]}
    reused = Path(cell["checkpoint"]).exists() if cell["mode"] == "fastnas" else False
    try:
        model, _ = mtp.prune(model, mode=cell["mode"], constraints={"params": budget}, dummy_input=dummy, config=config)
    except KeyError as exc:
        if cell["mode"] != "mcore_minitron":
            raise
        raise RuntimeError(
            f"mtp.prune(mode='mcore_minitron') raised KeyError {exc}: the mode is registered only when "
            "modelopt/torch/prune/plugins/mcore_minitron.py imports, which needs megatron.core (with "
            "Transformer Engine); ModelOpt documents the mode as required to prune NVIDIA Megatron-Core GPT or "
            "Mamba models, which a Hugging Face LlamaForCausalLM / BertForSequenceClassification is not"
        ) from exc
    model.eval()
    widths = [common.ffn_width(layer, cell["kind"]) for layer in common.blocks(model)]
    knobs = {
        "mode": cell["mode"],
        "constraints": {"params": budget},
        "score_func": cell["score_desc"],
        "search_space": "ModelOpt defaults: widths 5-100% of each nn.Linear output in 5% steps, multiples of 32",
        "max_iter_data_loader": 4,
        "sensitivity_map_reused": reused,
        "ffn_widths": widths,
    }
    return {"model": model, "tokenizer": tok, "knobs": knobs}


if __name__ == "__main__":
    common.main(prune, ["nvidia-modelopt"])
