"""The results pages of GPU runs and the job service: GPU latency, block reads, memory, load, GPU prunes."""

from __future__ import annotations

from bench.pages import values as v
from bench.pages.page import Page, _c

PAGES: dict[str, Page] = {
    "gpu_latency_depth.md": Page(
        "python bench/gpu_latency.py --ratios 0.5 --depth 8 16 8:0.3 4:0.4 --compiled-graph --rounds 3 (and a second "
        "run: see the page)",
        "gpu",
        (
            _c(
                "7B-shaped, compiled batch-1 decode over dense: 50% width / 8 of 32 blocks + 20% width",
                v.gpu_depth_decode,
            ),
            _c(
                "7B-shaped, prefill b8×512 over dense: 50% width / 8 of 32 blocks + 30% width",
                lambda: (
                    f"{v.times(v.gpu_depth('50% ÷128', 'prefill_b8x512_tok_s'))} / "
                    f"{v.times(v.gpu_depth('−8 blocks + 30% ÷128', 'prefill_b8x512_tok_s'))}"
                ),
            ),
        ),
        data=("gpu_latency_depth.json", "gpu_latency_depth2.json"),
    ),
    "query_heads.md": Page(
        "python bench/query_heads.py",
        "cpu",
        (
            _c(
                "SmolLM2 default recipe vs query_heads uniform (vLLM's form), perplexity at 20% / 50%",
                v.query_heads_cost,
            ),
        ),
    ),
    "block_reads.md": Page(
        "python bench/block_reads.py --shape 7b --layers 4 --dtype bfloat16",
        "cpu",
        (
            _c(
                "7B block read, one thread, warm page cache",
                lambda: f"{v.num(v.block_read('block_reads.json', 1), 2)} GB/s",
            ),
        ),
    ),
    "block_reads_gpu_host.md": Page(
        "python bench/block_reads.py --shape 7b --layers 4 --dtype bfloat16 --device cuda",
        "gpu",
        (
            _c(
                "7B block read, 4 threads, warm, into pinned memory",
                lambda: f"{v.num(v.block_read('block_reads_gpu_host.json', 4), 1)} GB/s",
            ),
        ),
    ),
    "peak_memory.md": Page(
        "python bench/peak_memory.py",
        "cpu",
        (_c("the FFN's refit at 7B widths, memory beyond the Gram: before / after", v._refit_peak),),
    ),
    "families.md": Page(
        "python bench/families.py",
        "jobs",
        (
            _c(
                "Gemma 3 270M through a job: perplexity of the job vs the reloaded checkpoint",
                lambda: v.pair(
                    v.num(v.data("families.json")["ppl_job"], 2),
                    v.num(v.data("families.json")["ppl_reloaded"], 2),
                    " vs ",
                ),
            ),
        ),
        cpu_times=True,
    ),
    "load.md": Page(
        "python bench/load.py",
        "jobs",
        (
            _c(
                "worst p95 of a call, 10,000 jobs, 8 clients",
                lambda: f"{v.num(max(r['p95_s'] for r in v.data('load.json')['rows']), 2)} s",
            ),
        ),
    ),
    "reliability.md": Page(
        "pytest -s tests/jobs/test_faults.py",
        "jobs",
        (
            _c(
                "fault cases of the job runner (SIGKILL, broker restart, …)",
                lambda: f"{len(v.md_table('reliability.md', 'case'))} cases, table on the page",
            ),
        ),
        data=(),  # no JSON: the page itself holds its numbers
    ),
    "gpu_liar.md": Page(
        "python bench/gpu_liar.py --shape 7b|13b|30b --samples 128 1024",
        "gpu",
        (
            _c(
                "7B-shaped, LIAR, 128 / 1024 samples",
                lambda: (
                    f"{v.gpu_liar_after('7B', '128', 'liar, holdout 8')} / {v.gpu_liar_after('7B', '1024', 'liar')} s"
                ),
            ),
            _c(
                "7B-shaped, 1024 samples, FFN inputs recomputed: time / peak device memory over the bf16 weights",
                v.gpu_liar_recompute,
                v.LIAR_H200,
            ),
            _c(
                "7B-shaped, LIAR, 128 / 1024 samples, error report on the fit statistics",
                lambda: " / ".join(v.gpu_liar_shape("7B", n)["seconds"].strip("*") for n in ("128", "1024")) + " s",
                v.LIAR_H200,
            ),
            _c(
                "30B-shaped in memory, 1024 samples: time / peak device memory",
                lambda: v.pair(
                    f"{v.gpu_liar_shape('30B', '1024')['seconds'].strip('*')} s",
                    f"{v.gpu_liar_shape('30B', '1024')['peak GB']} GB",
                ),
                v.LIAR_H200,
            ),
        ),
        data=(),  # no JSON: the page itself holds its numbers
    ),
    "gpu_stream.md": Page(
        "python bench/gpu_stream.py (bash bench/gpu_all.sh)",
        "gpu",
        (
            _c(
                "70B-shaped, 128 samples, streamed: peak device memory / time",
                lambda: v.pair(
                    f"{v.gb(v.gpu_stream(v.S70)['peak_device_mb'])} GB", f"{v.num(v.gpu_stream(v.S70)['total_s'], 0)} s"
                ),
            ),
        ),
    ),
    "gpu_stream_profile.txt": Page(
        "python bench/gpu_stream.py --profile",
        "gpu",
        (_c("torch.profiler table of the 7B streamed run", lambda: "profile"),),
        data=(),  # no JSON: the page itself holds its numbers
    ),
    "gpu_latency.md": Page(
        "python bench/gpu_latency.py",
        "gpu",
        (
            _c(
                "7B-shaped at 50%: prefill b8×512 over dense",
                lambda: v.times(
                    v.gpu_latency("50% ÷128", "prefill_b8x512_tok_s") / v.gpu_latency("dense", "prefill_b8x512_tok_s")
                ),
            ),
            _c(
                "7B-shaped at 50%: batch-1 decode, compiled + CUDA graph, over dense",
                lambda: v.times(
                    v.gpu_latency("dense", "decode_graph_compiled_ms", "gpu_latency_compiled.json")
                    / v.gpu_latency("50% ÷128", "decode_graph_compiled_ms", "gpu_latency_compiled.json")
                ),
            ),
        ),
        # the latest run's files; the earlier sections' runs keep their date and machine in the name
        data=(
            "gpu_latency.json",
            "gpu_latency_compiled.json",
            "gpu_latency_2026-11-26_h200.json",
            "gpu_latency_compiled_2026-11-26_h100.json",
        ),
    ),
    "gpu_check.md": Page(
        "python bench/gpu_check.py",
        "gpu",
        (_c("GPU path checks passed", v._gpu_checks),),
        data=(),  # no JSON: the page itself holds its numbers
    ),
}
