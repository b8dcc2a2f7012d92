"""Realised speed of uniformly pruned LLaMA-7B-shaped models on a GPU: prefill and decode, eager and compiled.

A uniformly pruned model is a stock LLaMA with fewer heads and a narrower FFN, so its speed does not
depend on the weights: this builds random bfloat16 models of the widths that uniform pruning of
heads and neurons leaves (dense; 20/30/50% removed with exact widths and with FFN widths rounded to
128, the GPU default of ``round_to.neurons: auto``) and measures

- prefill tokens/s: one forward over batch × prompt tokens (batch 8 × 512 and batch 1 × 512);
- decode ms/token, batch 1, 64 new tokens after a 128-token prompt: ``model.generate`` eager (dynamic
  KV cache); greedy decoding with a static KV cache whose one-token step is captured once as a CUDA
  graph and replayed (:func:`graph_decode`: no Python or kernel-launch cost per layer, the tokens are
  checked against the same loop run eagerly); with ``--compile`` also ``generate`` with a static
  cache, which compiles the forward itself (``torch.compile``; slow to compile, and it skipped CUDA
  graphs here because the cache mutates its inputs).

Median of repeats after warm-up, CUDA events. Writes docs/results/gpu_latency.md (+ .json).

    python bench/gpu_latency.py [--ratios 0.2 0.5] [--exact] [--compile] [--out FILE]
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

HIDDEN, FFN, HEADS, LAYERS, VOCAB = 4096, 11008, 32, 32, 32000
WARMUPS = 3  # forwards of the captured step before capture (compiling it when asked)


def widths(ratio: float, multiple: int) -> tuple[int, int]:
    """Kept heads and FFN width after removing ``ratio`` of each (uniform pruning of both modules)."""
    heads = max(1, round(HEADS * (1 - ratio)))
    neurons = round(FFN * (1 - ratio))
    if multiple > 1:
        neurons = max(multiple, round(neurons / multiple) * multiple)
    return heads, neurons


def build(heads: int, neurons: int):
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(
        hidden_size=HIDDEN,
        intermediate_size=neurons,
        num_hidden_layers=LAYERS,
        num_attention_heads=HEADS,
        num_key_value_heads=HEADS,
        head_dim=HIDDEN // HEADS,
        vocab_size=VOCAB,
        max_position_embeddings=2048,
    )
    # transformers refuses a stock config whose head count does not divide the hidden size (26 of
    # 4096): set the pruned count after validation, as a liar_ checkpoint's layers end up
    cfg.num_attention_heads = cfg.num_key_value_heads = heads
    with torch.device("cuda"):
        model = LlamaForCausalLM(cfg).to(torch.bfloat16).eval()
    return model


def _time(fn, repeats: int = 5, warmup: int = 2) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / 1000)
    return statistics.median(times)


@torch.no_grad()
def measure(model, compile_decode: bool, compiled_graph: bool = False, decode_only: bool = False) -> dict:
    out = {"params": sum(p.numel() for p in model.parameters())}
    prompt = torch.randint(0, VOCAB, (1, 128), device="cuda")
    new = 64
    if compiled_graph:
        try:
            out.update(graph_decode(model, prompt, new, compiled=True))
        except Exception as exc:  # record why, keep the other numbers
            out["decode_graph_compiled_error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    if decode_only:
        return out
    for batch, length in ((8, 512), (1, 512)):
        ids = torch.randint(0, VOCAB, (batch, length), device="cuda")
        out[f"prefill_b{batch}x{length}_tok_s"] = batch * length / _time(lambda ids=ids: model(ids, use_cache=False))

    def gen():
        model.generate(prompt, max_new_tokens=new, min_new_tokens=new, do_sample=False, pad_token_id=0)

    out["decode_eager_ms"] = 1000 * _time(gen, repeats=3, warmup=1) / new
    try:
        out.update(graph_decode(model, prompt, new))
    except Exception as exc:  # record why, keep the other numbers
        out["decode_graph_error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
    if compile_decode:
        try:  # generate() compiles the forward itself once the KV cache is static (CompileConfig)
            model.generation_config.cache_implementation = "static"
            out["decode_compiled_ms"] = 1000 * _time(gen, repeats=3, warmup=3) / new
        except Exception as exc:  # record why, keep the eager numbers
            out["decode_compiled_error"] = f"{type(exc).__name__}: {str(exc)[:200]}"
    return out


def _static_loop(model, cache, prompt, new: int, step) -> list[int]:
    """Greedy decoding after an eager prefill into ``cache``; ``step(next_ids, position)`` returns the
    logits of one step. Tokens stay on the device until the end (no sync per token)."""
    length = prompt.shape[1]
    for layer in cache.layers:  # StaticLayer keeps its fill level in a device tensor
        if getattr(layer, "is_initialized", False):
            layer.cumulative_length.zero_()
    out = model(
        input_ids=prompt,
        past_key_values=cache,
        use_cache=True,
        cache_position=torch.arange(length, device=prompt.device),
    )
    nxt = out.logits[:, -1].argmax(-1, keepdim=True)
    tokens = [nxt]
    for i in range(new):
        nxt = step(nxt, length + i)[:, -1].argmax(-1, keepdim=True)
        tokens.append(nxt)
    return torch.cat(tokens, 1)[0].tolist()


@torch.no_grad()
def graph_decode(model, prompt, new: int, repeats: int = 3, compiled: bool = False) -> dict:
    """ms/token of greedy batch-1 decoding whose step is one CUDA graph replay, and whether its tokens
    equal the same static-cache loop run eagerly.

    The step (``model.forward`` on one token with a static KV cache) is captured once: its input ids,
    position and logits live in fixed buffers, the cache's tensors have fixed addresses, and the
    cache advances its own fill counter on the device, so a replay does one whole step with no host
    work per layer. ``compiled``: the step is ``torch.compile``'d first (fused element-wise kernels,
    fewer of them in the graph); keys get a ``_compiled`` suffix and ``compile_s`` says what it cost."""
    import time

    from transformers import StaticCache

    length = prompt.shape[1]
    # room for the warm-up steps after a full loop (each advances the counter; an index past the end
    # is a device-side assert)
    cache = StaticCache(config=model.config, max_cache_len=length + new + WARMUPS + 1)
    ids = torch.zeros((prompt.shape[0], 1), dtype=torch.long, device=prompt.device)
    pos = torch.zeros((1,), dtype=torch.long, device=prompt.device)

    step = torch.compile(model.forward, dynamic=False) if compiled else model.forward

    def forward():
        return step(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=pos).logits

    def eager(nxt, position):
        ids.copy_(nxt)
        pos.fill_(position)
        return model(input_ids=ids, past_key_values=cache, use_cache=True, cache_position=pos).logits

    reference = _static_loop(model, cache, prompt, new, eager)  # also initialises the cache's buffers
    t0 = time.perf_counter()
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # capture needs warmed-up (and compiled) kernels and workspaces
        for _ in range(WARMUPS if compiled else 1):
            forward()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    compile_s = time.perf_counter() - t0
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        logits = forward()

    def replay(nxt, position):
        ids.copy_(nxt)
        pos.fill_(position)
        graph.replay()
        return logits

    tokens = _static_loop(model, cache, prompt, new, replay)
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        _static_loop(model, cache, prompt, new, replay)
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) / new)
    suffix = "_compiled" if compiled else ""
    out = {
        f"decode_graph{suffix}_ms": statistics.median(times),
        f"decode_graph{suffix}_same_tokens": tokens == reference,
    }
    return {**out, "compile_s": compile_s} if compiled else out


def _cell(row: dict, dense: dict, key: str, higher_better: bool = True) -> str:
    if key not in row or key not in dense:
        return "–"
    if higher_better:
        return f"{row[key]:,.0f} ({row[key] / dense[key]:.2f}×)"
    return f"{row[key]:.2f} ({dense[key] / row[key]:.2f}×)"


def write_table(rows: list[dict], out: str) -> None:
    dense = rows[0]
    lines = [
        "# Realised speed of uniformly pruned LLaMA-7B-shaped models (bfloat16)",
        "",
        f"Measured {dt.date.today().isoformat()} on {torch.cuda.get_device_name()}, torch {torch.__version__}; "
        "`python bench/gpu_latency.py`. Speed-ups against the dense model in brackets. Decode: batch 1, "
        "64 new tokens after a 128-token prompt; *graph* = static KV cache, one CUDA graph per step "
        "(tokens equal to the eager static-cache loop unless marked).",
        "",
        "| model | heads | FFN | params (B) | prefill 8×512 tok/s | prefill 1×512 tok/s "
        "| decode eager ms/tok | decode graph ms/tok | decode compiled + graph ms/tok | decode compiled ms/tok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        graph = _cell(r, dense, "decode_graph_ms", False)
        if r.get("decode_graph_same_tokens") is False:
            graph += " (tokens differ)"
        elif "decode_graph_error" in r:
            graph = "error: " + r["decode_graph_error"][:80].replace("|", "/")
        cgraph = _cell(r, dense, "decode_graph_compiled_ms", False)
        if r.get("decode_graph_compiled_same_tokens") is False:
            cgraph += " (tokens differ)"
        elif "decode_graph_compiled_error" in r:
            cgraph = "error: " + r["decode_graph_compiled_error"][:80].replace("|", "/")
        lines.append(
            f"| {r['model']} | {r['heads']} | {r['ffn']} | {r['params'] / 1e9:.2f} | "
            f"{_cell(r, dense, 'prefill_b8x512_tok_s')} | {_cell(r, dense, 'prefill_b1x512_tok_s')} | "
            f"{_cell(r, dense, 'decode_eager_ms', False)} | {graph} | {cgraph} | "
            f"{_cell(r, dense, 'decode_compiled_ms', False)} |"
        )
    Path(out).write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.2, 0.3, 0.5])
    p.add_argument("--multiple", type=int, default=128)
    p.add_argument("--exact", action="store_true", help="also the exact (unrounded) widths")
    p.add_argument("--compile", action="store_true", help="also generate() with a compiled static cache (slow)")
    p.add_argument("--compiled-graph", action="store_true", help="also the CUDA-graph decode of a compiled step")
    p.add_argument("--decode-only", action="store_true", help="only the compiled CUDA-graph decode (with it)")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "gpu_latency.md"))
    args = p.parse_args()
    rows = []
    tags = ((("exact", 1),) if args.exact else ()) + ((f"÷{args.multiple}", args.multiple),)
    configs = [("dense", 0.0, 1)] + [(f"{int(r * 100)}% {tag}", r, m) for r in args.ratios for tag, m in tags]
    seen = set()
    for label, ratio, multiple in configs:
        heads, neurons = (HEADS, FFN) if ratio == 0 else widths(ratio, multiple)
        if (heads, neurons) in seen:  # rounding changed nothing (e.g. 50%: 5504 = 43 × 128)
            continue
        seen.add((heads, neurons))
        model = build(heads, neurons)
        row = {
            "model": label,
            "heads": heads,
            "ffn": neurons,
            **measure(model, args.compile, args.compiled_graph, args.decode_only),
        }
        rows.append(row)
        print(json.dumps(row), flush=True)
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
        write_table(rows, args.out)
        del model
        torch._dynamo.reset()
        torch.cuda.empty_cache()
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
