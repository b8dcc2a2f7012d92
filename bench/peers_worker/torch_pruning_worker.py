"""Torch-Pruning (``torch-pruning`` on PyPI) on SmolLM2 and the MiniLM classifier, by its documented recipes.

Runs in the Torch-Pruning environment made by ``bench/peers.py``. The recipes follow the project's
examples: ``examples/LLMs/prune_llm.py`` for the LLaMA-family decoder (``MetaPruner`` with per-layer
uniform ratios, ``num_heads`` for q/k/v, whole heads removed and head dimensions kept, the head
ratio equal to the channel ratio, ``lm_head`` ignored, widths rounded to multiples of 4) and
``examples/transformers/prune_hf_bert.py`` for BERT (global pruning, whole heads, the pooler ignored).
Importance: ``GroupMagnitudeImportance(p=2)`` (the examples' L2 norm) or ``GroupTaylorImportance``
with gradients of the calibration loss (the LM loss of the calibration windows; the classification
loss of the labelled calibration snippets), as in the examples' Taylor path.

Structures (``cell["structure"]``):
- ``width``: the examples as written — the residual width (embeddings, norms, every projection) is
  pruned by the same ratio as heads and FFN channels; the ratio that removes the target fraction of
  block parameters is found first (``cell["mode"] == "fit"``, magnitude importance).
- ``bottleneck``: the attention and FFN output projections are ignored, so only heads and FFN
  channels go and the residual width stays (Torch-Pruning's "bottleneck" option of its ViT
  examples; the structure our pruning uses); ratio = target.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402
import torch_pruning as tp  # noqa: E402


def _heads(model, kind: str, gqa: str = "documented") -> tuple[dict, list]:
    """``num_heads`` for q/k/v and the output projections of each block (attention, FFN).

    ``gqa="documented"``: q_proj has the query heads, k/v the key/value heads (prune_llm.py).
    ``gqa="groups"``: q_proj declared with as many heads as key/value groups (all three equal, so
    Torch-Pruning takes the plain multi-head path) — the workaround when the documented form fails.
    ``gqa="keep"``: attention untouched — q/k/v/o ignored and no heads declared (declaring them with
    ``prune_num_heads=False`` fails the same way as the documented form); FFN channels only.
    """
    num_heads, outputs = {}, []
    for layer in common.blocks(model):
        if kind == "decoder":
            att, cfg = layer.self_attn, model.config
            outputs += [att.o_proj, layer.mlp.down_proj]
            if gqa == "keep":  # attention left as it is: its projections ignored, no heads declared
                outputs += [att.q_proj, att.k_proj, att.v_proj]
                continue
            q_heads = cfg.num_key_value_heads if gqa == "groups" else cfg.num_attention_heads
            num_heads.update({att.q_proj: q_heads, att.k_proj: cfg.num_key_value_heads})
            num_heads[att.v_proj] = cfg.num_key_value_heads
        else:
            att = layer.attention.self
            num_heads.update({att.query: att.num_attention_heads, att.key: att.num_attention_heads})
            num_heads[att.value] = att.num_attention_heads
            outputs += [layer.attention.output.dense, layer.output.dense]
    return num_heads, outputs


def _example_inputs(model, tok, kind: str) -> dict:
    enc = tok("Hello world.", return_tensors="pt")
    if kind == "decoder":  # no cache: transformers 5's cache object in the output breaks the graph tracing
        return {"input_ids": enc["input_ids"], "use_cache": False}
    return {k: enc[k] for k in ("input_ids", "token_type_ids", "attention_mask") if k in enc}


def _pruner(model, tok, cell: dict, ratio: float, importance):
    """MetaPruner with the example's knobs: channel ratio ``ratio``, head ratio the cell's target."""
    kind = cell["kind"]
    num_heads, outputs = _heads(model, kind, cell["knobs"].get("gqa", "documented"))
    head = model.lm_head if kind == "decoder" else model.classifier
    ignored = [head] + ([] if kind == "decoder" else [model.bert.pooler.dense])
    if cell["structure"] == "bottleneck":
        ignored += outputs
    kwargs = dict(round_to=4) if kind == "decoder" else dict(output_transform=lambda out: out.logits.sum())
    return tp.pruner.MetaPruner(
        model,
        example_inputs=_example_inputs(model, tok, kind),
        importance=importance,
        global_pruning=kind != "decoder",  # prune_llm.py: uniform per layer; prune_hf_bert.py: global
        pruning_ratio=ratio,
        ignored_layers=ignored,
        num_heads=num_heads,
        prune_num_heads=cell["knobs"].get("gqa") != "keep",
        prune_head_dims=False,
        head_pruning_ratio=cell["ratio"],
        **kwargs,
    )


def _fix_attributes(model, pruner, kind: str) -> list[int]:
    """Tell the HF modules their new widths (what the examples do after ``g.prune()``); returns the
    kept query heads per layer."""
    heads = []
    if kind == "decoder":
        cfg = model.config
        cfg.hidden_size = model.lm_head.in_features
        for layer in common.blocks(model):
            att = layer.self_attn
            q, kv = att.q_proj.out_features // att.head_dim, att.k_proj.out_features // att.head_dim
            att.num_key_value_groups = q // kv
            heads.append(q)
        cfg.intermediate_size = common.blocks(model)[0].mlp.gate_proj.out_features
        return heads
    for layer in common.blocks(model):
        att = layer.attention.self
        att.num_attention_heads = pruner.num_heads[att.query]
        att.attention_head_size = att.query.out_features // att.num_attention_heads
        att.all_head_size = att.query.out_features
        heads.append(att.num_attention_heads)
    return heads


def _accumulate_gradients(model, cell: dict) -> None:
    """Gradients of the calibration loss, summed over batches (the examples' Taylor path)."""
    calib = common.calibration(cell)
    model.zero_grad()
    for batch in common.batches(calib, 8):
        if cell["kind"] == "decoder":
            out = model(input_ids=batch["input_ids"], labels=batch["input_ids"], use_cache=False)
        else:
            out = model(**{k: v for k, v in batch.items()})
        out.loss.backward()


def _importance(name: str):
    if name == "magnitude":
        return tp.importance.GroupMagnitudeImportance(p=2, group_reduction="mean")
    if name == "taylor":
        return tp.importance.GroupTaylorImportance()
    raise ValueError(f"unknown importance {name!r}")


def _prune_copy(model, tok, cell: dict, ratio: float, importance) -> tuple:
    pruner = _pruner(model, tok, cell, ratio, importance)
    for group in pruner.step(interactive=True):
        group.prune()
    heads = _fix_attributes(model, pruner, cell["kind"])
    return model, heads


def prune(cell: dict) -> dict:
    model, tok = common.load_dense(cell)
    ratio = cell["knobs"]["pruning_ratio"]
    if cell["importance"] == "taylor":
        _accumulate_gradients(model, cell)
    model, heads = _prune_copy(model, tok, cell, ratio, _importance(cell["importance"]))
    model.zero_grad(set_to_none=True)
    model.eval()
    widths = sorted({common.ffn_width(layer, cell["kind"]) for layer in common.blocks(model)})
    knobs = {
        **cell["knobs"],
        "head_pruning_ratio": cell["ratio"],
        "global_pruning": cell["kind"] != "decoder",
        "query_heads_kept": heads,
        "ffn_widths": widths,
        "hidden_size": model.config.hidden_size if cell["kind"] == "decoder" else hidden_of(model),
    }
    return {"model": model, "tokenizer": tok, "knobs": knobs}


def hidden_of(model) -> int:
    return model.bert.embeddings.word_embeddings.embedding_dim


def _copy_with_grads(model):
    twin = copy.deepcopy(model)  # Parameter.__deepcopy__ leaves .grad behind
    for p, q in zip(model.parameters(), twin.parameters()):
        q.grad = None if p.grad is None else p.grad.clone()
    return twin


def fit_ratio(cell: dict) -> dict:
    """The channel ratio whose pruning removes ``cell["ratio"]`` of the block parameters (bisection on
    copies of the dense model). Per-layer (decoder) widths do not depend on the importance, so the
    fit uses magnitude; global pruning (the BERT example) ranks across layers, so it uses the cell's."""
    common.setup()
    dense, tok = common.load_dense(cell)
    name = cell["importance"] if cell["kind"] == "encoder" else "magnitude"
    if name == "taylor":
        _accumulate_gradients(dense, cell)
    before = common.count_params(dense)["block_params"]
    lo, hi, best = 0.0, 0.95, None
    for _ in range(10):
        mid = (lo + hi) / 2
        pruned, _ = _prune_copy(_copy_with_grads(dense), tok, cell, mid, _importance(name))
        removed = 1 - common.count_params(pruned)["block_params"] / before
        if best is None or abs(removed - cell["ratio"]) < abs(best[1] - cell["ratio"]):
            best = (mid, removed)
        lo, hi = (mid, hi) if removed < cell["ratio"] else (lo, mid)
    return {"pruning_ratio": round(best[0], 5), "removed_at_fit": best[1], "fit_importance": name}


if __name__ == "__main__":
    cell = json.loads(sys.argv[1])
    if cell.get("mode") == "fit":
        print("RESULT " + json.dumps(fit_ratio(cell)), flush=True)
    else:
        common.main(prune, ["torch-pruning"])
