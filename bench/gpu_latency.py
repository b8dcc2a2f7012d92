"""Realised speed of uniformly pruned LLaMA-7B-shaped models on a GPU: prefill and decode, eager and compiled.

A uniformly pruned model is a stock LLaMA with fewer heads and a narrower FFN, so its speed does not
depend on the weights: this builds random bfloat16 models of the widths that uniform pruning of
heads and neurons leaves (dense; 20/30/50% removed with exact widths and with FFN widths rounded to
128, the GPU default of ``round_to.neurons: auto``) and measures

- prefill tokens/s: one forward over batch × prompt tokens (batch 8 × 512 and batch 1 × 512);
- decode ms/token, batch 1, 64 new tokens after a 128-token prompt: ``model.generate`` eager (dynamic
  KV cache); greedy decoding with a static KV cache whose one-token step is captured once as a CUDA
  graph and replayed (:class:`GraphDecode`: no Python or kernel-launch cost per layer; its tokens are
  checked against the same loop run eagerly); with ``--compiled-graph`` also a graph of the
  ``torch.compile``'d step (fused element-wise kernels).

Every model is built first and the measurements go in rounds over all of them (``--rounds``, median
per cell; the JSON keeps every sample), so a slow stretch of the machine falls on every model alike.
CUDA events time each call. Writes docs/results/gpu_latency.md (+ .json).

    python bench/gpu_latency.py [--ratios 0.2 0.5] [--exact] [--compiled-graph] [--rounds 5] [--out FILE]
    python bench/gpu_latency.py --shape smoke --device cpu --rounds 2 --out /tmp/lat.md   # code paths, CPU
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

SHAPES = {  # hidden, FFN, heads, layers, vocab
    "7b": (4096, 11008, 32, 32, 32000),
    "smoke": (64, 176, 4, 2, 512),  # a CPU run of the code paths (no graphs there)
}
WARMUPS = 3  # forwards of the captured step before capture (compiling it when asked)
PREFILL = ((8, 512), (1, 512))
PROMPT, NEW = 128, 64  # decode: new greedy tokens after a prompt of this length


def widths(ratio: float, multiple: int, shape: str = "7b") -> tuple[int, int]:
    """Kept heads and FFN width after removing ``ratio`` of each (uniform pruning of both modules)."""
    _, ffn, n_heads, _, _ = SHAPES[shape]
    heads = max(1, round(n_heads * (1 - ratio)))
    neurons = round(ffn * (1 - ratio))
    if multiple > 1:
        neurons = max(multiple, round(neurons / multiple) * multiple)
    return heads, neurons


def build(heads: int, neurons: int, shape: str = "7b", device: str = "cuda", removed: int = 0):
    """A random model of ``shape`` with ``heads`` heads and FFN width ``neurons`` per block and
    ``removed`` of its blocks taken out (depth pruning leaves a stock LLaMA with fewer layers)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    hidden, _, n_heads, layers, vocab = SHAPES[shape]
    layers -= removed
    cfg = LlamaConfig(
        hidden_size=hidden,
        intermediate_size=neurons,
        num_hidden_layers=layers,
        num_attention_heads=n_heads,
        num_key_value_heads=n_heads,
        head_dim=hidden // n_heads,
        vocab_size=vocab,
        max_position_embeddings=2048,
    )
    # transformers refuses a stock config whose head count does not divide the hidden size (26 of
    # 4096): set the pruned count after validation, as a liar_ checkpoint's layers end up
    cfg.num_attention_heads = cfg.num_key_value_heads = heads
    dtype = torch.bfloat16 if device.startswith("cuda") else torch.float32
    with torch.device(device):
        model = LlamaForCausalLM(cfg).to(dtype).eval()
    return model


def _seconds(fn, device: torch.device) -> float:
    """Wall time of one call (CUDA events on a GPU)."""
    if device.type != "cuda":
        t0 = time.perf_counter()
        fn()
        return time.perf_counter() - t0
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / 1000


class Subject:
    """One model under measurement: its inputs, its captured decode graphs, and one sample of every
    metric per :meth:`measure` call (the rounds interleave the models, so a slow stretch of the
    machine falls on all of them alike)."""

    def __init__(self, label: str, heads: int, neurons: int, args, removed: int = 0):
        self.label, self.heads, self.neurons = label, heads, neurons
        self.model = build(heads, neurons, args.shape, args.device, removed)
        self.layers = SHAPES[args.shape][3] - removed
        self.device = torch.device(args.device)
        vocab = SHAPES[args.shape][4]
        gen = torch.Generator().manual_seed(0)  # the same inputs for every model
        self.prefill = {(b, n): torch.randint(0, vocab, (b, n), generator=gen).to(self.device) for b, n in PREFILL}
        self.prompt = torch.randint(0, vocab, (1, PROMPT), generator=gen).to(self.device)
        self.info: dict = {"params": sum(p.numel() for p in self.model.parameters())}
        self.graphs: dict[str, GraphDecode] = {}
        wanted = [("graph", False)] * (not args.decode_only) + [("graph_compiled", True)] * args.compiled_graph
        if self.device.type == "cuda":
            for key, compiled in wanted:
                try:
                    self.graphs[key] = g = GraphDecode(self.model, self.prompt, NEW, compiled)
                    self.info[f"decode_{key}_same_tokens"] = g.same_tokens
                    if compiled:
                        self.info["compile_s"] = round(g.compile_s, 1)
                except Exception as exc:  # record why, keep the other numbers
                    self.info[f"decode_{key}_error"] = f"{type(exc).__name__}: {str(exc).strip()[:300]}"
        self.samples: dict[str, list[float]] = {}

    def _add(self, key: str, value: float) -> None:
        self.samples.setdefault(key, []).append(value)

    @torch.no_grad()
    def measure(self, decode_only: bool, warm_up: bool) -> None:
        """One sample of each metric (prefill: the median of three forwards); ``warm_up`` runs each
        once untimed first."""
        model = self.model
        if not decode_only:
            for (b, n), ids in self.prefill.items():

                def prefill(ids=ids):
                    model(ids, use_cache=False)

                if warm_up:
                    prefill()
                seconds = statistics.median(_seconds(prefill, self.device) for _ in range(3))
                self._add(f"prefill_b{b}x{n}_tok_s", b * n / seconds)

            def generate():
                model.generate(self.prompt, max_new_tokens=NEW, min_new_tokens=NEW, do_sample=False, pad_token_id=0)

            if warm_up:
                generate()
            self._add("decode_eager_ms", 1000 * _seconds(generate, self.device) / NEW)
        for key, graph in self.graphs.items():
            self._add(f"decode_{key}_ms", 1000 * _seconds(graph.run, self.device) / NEW)

    def row(self) -> dict:
        medians = {k: statistics.median(v) for k, v in self.samples.items()}
        every = {f"{k}_all": [round(x, 4) for x in v] for k, v in self.samples.items()}
        return {
            "model": self.label,
            "layers": self.layers,
            "heads": self.heads,
            "ffn": self.neurons,
            **self.info,
            **medians,
            **every,
        }


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


class GraphDecode:
    """Greedy batch-1 decoding whose step is one CUDA graph replay; ``same_tokens``: whether its tokens
    equal those of the same static-cache loop run eagerly.

    The step (``model.forward`` on one token with a static KV cache) is captured once: its input ids,
    position and logits live in fixed buffers, the cache's tensors have fixed addresses, and the
    cache advances its own fill counter on the device, so a replay does one whole step with no host
    work per layer. ``compiled``: the step is ``torch.compile``'d first (fused element-wise kernels,
    fewer of them in the graph); ``compile_s`` says what that cost."""

    @torch.no_grad()
    def __init__(self, model, prompt, new: int, compiled: bool = False):
        from transformers import StaticCache

        self.model, self.prompt, self.new = model, prompt, new
        length = prompt.shape[1]
        # room for the warm-up steps after a full loop (each advances the counter; an index past the
        # end is a device-side assert)
        self.cache = cache = StaticCache(config=model.config, max_cache_len=length + new + WARMUPS + 1)
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
        self.compile_s = time.perf_counter() - t0
        self.graph = graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            logits = forward()

        def replay(nxt, position):
            ids.copy_(nxt)
            pos.fill_(position)
            graph.replay()
            return logits

        self.replay = replay
        self.same_tokens = self.run() == reference

    @torch.no_grad()
    def run(self) -> list[int]:
        return _static_loop(self.model, self.cache, self.prompt, self.new, self.replay)


def _cell(row: dict, dense: dict, key: str, higher_better: bool = True) -> str:
    if key not in row or key not in dense:
        return "–"
    if higher_better:
        return f"{row[key]:,.0f} ({row[key] / dense[key]:.2f}×)"
    return f"{row[key]:.2f} ({dense[key] / row[key]:.2f}×)"


def _graph_cell(row: dict, dense: dict, key: str) -> str:
    """A CUDA-graph decode's cell (``key``: graph or graph_compiled), marked where it failed or its tokens differ."""
    if row.get(f"decode_{key}_same_tokens") is False:
        return _cell(row, dense, f"decode_{key}_ms", False) + " (tokens differ)"
    if f"decode_{key}_error" in row:
        return "error: " + row[f"decode_{key}_error"][:80].replace("|", "/")
    return _cell(row, dense, f"decode_{key}_ms", False)


def write_table(rows: list[dict], out: str, rounds: int, device: str) -> None:
    dense = rows[0]
    where = torch.cuda.get_device_name() if device.startswith("cuda") else "CPU"
    lines = [
        "# Realised speed of uniformly pruned LLaMA-7B-shaped models (bfloat16)",
        "",
        f"Measured {dt.date.today().isoformat()} on {where}, torch {torch.__version__}; "
        "`python bench/gpu_latency.py`. Speed-ups against the dense model in brackets; each cell the "
        f"median of {rounds} rounds that interleave the models (the JSON has every sample). Decode: batch "
        f"1, {NEW} new tokens after a {PROMPT}-token prompt; *graph* = static KV cache, one CUDA graph per "
        "step (tokens equal to the eager static-cache loop unless marked).",
        "",
        "| model | layers | heads | FFN | params (B) | prefill 8×512 tok/s | prefill 1×512 tok/s "
        "| decode eager ms/tok | decode graph ms/tok | decode compiled + graph ms/tok |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        graph, cgraph = (_graph_cell(r, dense, key) for key in ("graph", "graph_compiled"))
        lines.append(
            f"| {r['model']} | {r.get('layers', '–')} | {r['heads']} | {r['ffn']} | {r['params'] / 1e9:.2f} | "
            f"{_cell(r, dense, 'prefill_b8x512_tok_s')} | {_cell(r, dense, 'prefill_b1x512_tok_s')} | "
            f"{_cell(r, dense, 'decode_eager_ms', False)} | {graph} | {cgraph} |"
        )
    Path(out).write_text("\n".join(lines) + "\n")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ratios", type=float, nargs="+", default=[0.2, 0.3, 0.5])
    p.add_argument("--multiple", type=int, default=128)
    p.add_argument("--exact", action="store_true", help="also the exact (unrounded) widths")
    p.add_argument("--rounds", type=int, default=5, help="rounds over all models; cells are the medians")
    p.add_argument("--compiled-graph", action="store_true", help="also the CUDA-graph decode of a compiled step")
    p.add_argument("--decode-only", action="store_true", help="only the compiled CUDA-graph decode (with it)")
    p.add_argument(
        "--depth",
        nargs="*",
        default=[],
        metavar="BLOCKS[:RATIO]",
        help="also models with BLOCKS blocks removed and RATIO of each kept block's heads and neurons (default 0)",
    )
    p.add_argument("--shape", default="7b", choices=sorted(SHAPES))
    p.add_argument("--device", default="cuda")
    p.add_argument("--out", default=str(ROOT / "docs" / "results" / "gpu_latency.md"))
    args = p.parse_args()
    tags = ((("exact", 1),) if args.exact else ()) + ((f"÷{args.multiple}", args.multiple),)
    configs = [("dense", 0.0, 1, 0)] + [(f"{int(r * 100)}% {tag}", r, m, 0) for r in args.ratios for tag, m in tags]
    for spec in args.depth:
        blocks, _, ratio = spec.partition(":")
        removed, ratio = int(blocks), float(ratio or 0)
        label = f"−{removed} blocks" + (f" + {int(ratio * 100)}% ÷{args.multiple}" if ratio else "")
        configs.append((label, ratio, args.multiple, removed))
    subjects, seen = [], set()
    _, ffn, n_heads, _, _ = SHAPES[args.shape]
    for label, ratio, multiple, removed in configs:  # every model built first: the rounds interleave them
        heads, neurons = (n_heads, ffn) if ratio == 0 else widths(ratio, multiple, args.shape)
        if (heads, neurons, removed) in seen:  # rounding changed nothing (e.g. 50%: 5504 = 43 × 128)
            continue
        seen.add((heads, neurons, removed))
        subjects.append(Subject(label, heads, neurons, args, removed))
        print(json.dumps({"built": label, **subjects[-1].info}), flush=True)
    for r in range(args.rounds):
        for subject in subjects:
            subject.measure(args.decode_only, warm_up=r == 0)
        rows = [s.row() for s in subjects]
        Path(args.out).with_suffix(".json").write_text(json.dumps(rows, indent=1))
        write_table(rows, args.out, r + 1, args.device)
        print(f"round {r + 1} done", flush=True)
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
