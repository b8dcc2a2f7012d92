"""``liar prune``, ``liar demo`` (and ``liar eval``, registered here): the engine's verbs on one model.

    liar prune RECIPE.yaml --output DIR
    liar prune --model M --criterion magnitude --ratio 0.5 --reconstruction liar \\
               --calibration FILE --samples 128 --seq-len 128 --output DIR [--export gguf-q4_k_m]
    liar eval …                     (app.cli.evaluate)
    liar demo                       # prune a tiny random model end to end (no downloads)
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

from app.cli.common import DTYPES, PERPLEXITY_KEYS, fail
from app.cli.evaluate import register_eval


def recipe_from_args(args: argparse.Namespace):
    """The recipe file (if any) with the flags laid over it, validated."""
    from core.spec.recipe import Recipe

    flags = {
        "model": args.model,
        "modules": args.modules,
        "ratio": args.ratio,
        "allocation": args.allocation,
        "dtype": args.dtype,
        "device": args.device,
        "execution": args.execution,
        "activations": args.activations,
        "export": args.export,
        "query_heads": args.query_heads,
    }
    if args.recipe:
        recipe = Recipe.load(args.recipe)
        data = recipe.model_dump(mode="json", exclude_none=True)
        data.update({k: v for k, v in flags.items() if v is not None})
    else:
        missing = ["--model"] if flags["model"] is None else []
        if flags["ratio"] is None and args.speedup is None:
            missing.append("--ratio or --speedup")
        if args.calibration is None:
            missing.append("--calibration")
        if missing:
            raise ValueError(f"give a recipe file or at least {', '.join(missing)}")
        data = {k: v for k, v in flags.items() if v is not None}
        data["calibration"] = {}
    if args.speedup is not None or args.workload is not None:
        if args.speedup is None and "target" not in data:
            raise ValueError("--workload goes with --speedup (the speed-up to reach on that workload)")
        data.pop("ratio", None) if flags["ratio"] is None else None
        speed = data.setdefault("target", {})
        speed.update({k: v for k, v in (("speedup", args.speedup), ("workload", args.workload)) if v is not None})
    depth = {k: v for k, v in (("blocks", args.depth_blocks), ("select", args.depth_select)) if v is not None}
    if args.depth_reconstruction is not None:
        depth["reconstruction"] = args.depth_reconstruction
    if depth:
        data.setdefault("depth", {}).update(depth)
    if args.criterion:
        data["criterion"] = {"name": args.criterion}
    if args.round_neurons is not None:
        data.setdefault("round_to", {})["neurons"] = args.round_neurons
    if args.kv_groups is not None:
        data.setdefault("round_to", {})["kv_groups"] = args.kv_groups
    if args.paper and args.head_ratio is None:  # the paper's uniform split: heads at the layer's ratio
        data["head_ratio"] = "same"
    if args.head_ratio is not None:
        data["head_ratio"] = args.head_ratio
    recon = data.setdefault("reconstruction", {})
    if args.reconstruction:
        recon["method"] = args.reconstruction
    if args.damp is not None:
        recon["damp"] = args.damp
    if args.paper:  # the paper's LIAR: its reconstruction, the criterion's units (explicit flags win)
        recon["method"] = args.reconstruction or "liar"
        recon["select"] = args.select or "criterion"
    if args.positions is not None:
        recon["positions"] = args.positions
    if args.select is not None:
        recon["select"] = args.select
    if args.target is not None:
        recon["target"] = args.target
    cal = data["calibration"]
    if args.calibration:
        cal.pop("texts", None)
        cal["dataset"] = args.calibration
    for key, val in (
        ("num_calibration_samples", args.samples),
        ("max_seq_length", args.seq_len),
        ("seed", args.seed),
        ("batch_size", args.batch_size),
        ("holdout_samples", args.holdout),
        ("label_field", args.label_field),
    ):
        if val is not None:
            cal[key] = val
    return Recipe.model_validate(data)


def cmd_prune(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from core.models.export import check_output_dir
    from core.spec.errors import validation_lines

    try:
        recipe = recipe_from_args(args)
        out = check_output_dir(args.output, args.overwrite)
    except ValidationError as exc:
        return fail("invalid recipe:\n" + "\n".join(validation_lines(exc, prefix="  ")))
    except (ValueError, FileNotFoundError, FileExistsError) as exc:
        return fail(str(exc))
    if args.dry_run:
        from core.pipeline.preflight import model_kind, preflight

        try:
            preflight(recipe)
            _check_export(recipe, download=False)
        except ValueError as exc:
            return fail(str(exc))
        kind = model_kind(recipe.model)  # the recipe as it will run, where the model is known offline
        print((recipe if kind is None else recipe.resolved(*kind)).to_yaml(), end="")
        return 0

    from core.pipeline.sequential import prune

    try:
        _check_export(recipe, download=True)  # before hours of pruning, not after
        result = prune(recipe, show_progress=not args.quiet, output_dir=out, overwrite=args.overwrite)
    except (ValueError, RuntimeError, OSError) as exc:
        return fail(str(exc))
    try:
        if args.ppl:
            result.metrics.update(_perplexity(result, args.ppl, args.ppl_seq_len, args.quiet))
        path = result.save(out, overwrite=args.overwrite)
    except (ValueError, RuntimeError, OSError) as exc:
        return fail(str(exc))
    finally:
        result.discard()
    written, failed = _serving_files(path, recipe.export)
    summary = result.summary()
    if args.json:
        served = {"export": written, "export_failed": failed} if recipe.export else {}
        print(json.dumps({**summary, "output": str(path), **served}, indent=2))
    else:
        _print_prune_summary(recipe, summary, path)
        for form, file in written.items():
            print(f"{form}: {file} ({Path(file).stat().st_size / 2**20:,.1f} MiB)")
    return 1 if failed else 0


def _check_export(recipe, download: bool) -> None:
    """The serving forms the recipe asks for, checked against its model and against what the recipe will
    prune from it before pruning (``ExportError``, a ``ValueError``, with the sentence); a dry run does not
    download a hub model."""
    from core.serving import preflight_model

    preflight_model(recipe.model, recipe.export, download=download, recipe=recipe)


def _serving_files(checkpoint: Path, forms: list[str]) -> tuple[dict[str, str], dict[str, str]]:
    """Write each serving form into the saved checkpoint; ({form: file}, {form: why it failed}). A
    failure is a warning on stderr (and exit status 1): the checkpoint stays, and ``liar export`` can
    write the form later."""
    import sys

    from core.serving import export

    written, failed = {}, {}
    for form in forms:
        try:
            (file,) = export(checkpoint, [form])
        except Exception as exc:  # ExportError, llama.cpp's EngineError, a full disk: the prune stands
            failed[form] = str(exc) or type(exc).__name__
            print(f"liar: warning: export {form} failed; the checkpoint is kept: {failed[form]}", file=sys.stderr)
        else:
            written[form] = str(file)
    return written, failed


def _perplexity(result, source: str, seq_len: int | None, quiet: bool) -> dict:
    """Perplexity of the pruned model (``core.evaluate`` reads a streamed run's checkpoint block by block)."""
    from core.evaluation.run import evaluate

    spec = {"type": "perplexity", "text": source, "seq_len": seq_len or result.recipe.calibration.max_seq_length}
    out = evaluate(result, spec, show_progress=not quiet)
    return {key: out[key] for key in PERPLEXITY_KEYS}


def _print_prune_summary(recipe, summary: dict, path: Path) -> None:
    print(
        f"pruned {recipe.model}: {summary['achieved_ratio']:.1%} of block parameters removed "
        f"(target {summary['target_ratio']:.1%}), {summary['params_before']:,} → {summary['params_after']:,} "
        f"parameters in {summary['prune_seconds']:.1f} s"
    )
    if summary.get("depth_blocks_removed"):
        blocks = summary["depth_blocks_removed"]
        print(f"blocks {blocks[0]}–{blocks[-1]} removed ({len(blocks)} of {summary['depth_layers_before']})")
    if "target_speedup" in summary:
        print(
            f"speed-up ({summary['target_workload']} on {summary['target_device']}): "
            f"{summary['realised_speedup']:.2f}× measured, {summary['predicted_speedup']:.2f}× predicted, "
            f"{summary['target_speedup']:g}× asked; " + _target_choice(summary)
        )
    if abs(summary["ratio_deviation"]) > 0.01:
        print(
            f"note: {abs(summary['ratio_deviation']):.1%} "
            f"{'over' if summary['ratio_deviation'] > 0 else 'under'} the target ratio — the kept-width "
            "rounding (round_to) or the one-head/one-neuron-per-layer minimum prevents a closer fit"
        )
    if "perplexity" in summary:
        print(f"perplexity: {summary['perplexity']:.3f}")
    print(f"saved to {path}")


def cmd_demo(args: argparse.Namespace) -> int:
    """Prune a tiny random Llama end to end and evaluate it: proof that the install works."""
    from core.evaluation.perplexity import perplexity
    from core.models.tiny import tiny_corpus, tiny_decoder
    from core.pipeline.sequential import prune

    work = Path(args.output or tempfile.mkdtemp(prefix="liar-demo-"))
    work.mkdir(parents=True, exist_ok=True)
    model_dir = tiny_decoder(work / "tiny-llama")
    texts = tiny_corpus(60)
    calib, held = texts[:40], texts[40:]
    print(f"tiny random Llama (GQA 8/4 heads) written to {model_dir}")
    for method in ("none", "bias", "liar", "ls"):
        recipe = {
            "model": str(model_dir),
            "ratio": 0.3,
            "reconstruction": {"method": method},
            "calibration": {"texts": calib, "num_calibration_samples": 32, "max_seq_length": 64},
        }
        result = prune(recipe)
        ppl = perplexity(result.model, result.tokenizer, held, seq_len=64)["perplexity"]
        out = result.save(work / f"pruned-{method}", overwrite=True)
        err = sum(r.error_after for r in result.report) / max(len(result.report), 1)
        print(
            f"  {method:5s} removed {result.achieved_ratio:.1%}  mean layer error {err:.3f}  "
            f"held-out ppl {ppl:8.3f}  → {out}"
        )
    print("done. Next: liar prune --help")
    return 0


def _round_neurons(value: str) -> int | str:
    if value == "auto":
        return value
    try:
        return int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto or a whole number, got {value!r}") from None


def _head_ratio(value: str) -> float | str:
    if value in ("auto", "same", "obs"):
        return value
    try:
        return float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be auto, same, obs or a number in [0, 1), got {value!r}") from None


def register(sub) -> None:
    """Add ``prune``, ``eval`` and ``demo`` to the ``liar`` subcommands."""
    _register_prune(sub)
    register_eval(sub)
    d = sub.add_parser("demo", help="prune a tiny random model end to end (no downloads)")
    d.add_argument("--output", help="working directory (default: a new temporary one)")
    d.set_defaults(func=cmd_demo)


# the destinations of add_recipe_flags' flags (all but the recipe file)
_FLAG_NAMES = (
    "model modules ratio allocation head_ratio round_neurons kv_groups criterion reconstruction damp select target "
    "positions paper calibration samples seq_len holdout label_field seed batch_size dtype device execution activations"
    " export query_heads speedup workload depth_blocks depth_select depth_reconstruction"
)
RECIPE_FLAGS = tuple(_FLAG_NAMES.split())


def recipe_flags_given(args: argparse.Namespace) -> bool:
    """Whether any flag of :func:`add_recipe_flags` was given."""
    return any(getattr(args, k) is not None for k in RECIPE_FLAGS)


def _add_depth_flags(p: argparse.ArgumentParser) -> None:
    """What goes (heads, neurons, blocks), a speed target in place of the ratio, and the depth settings."""
    p.add_argument(
        "--modules",
        choices=["heads", "neurons", "both", "blocks"],
        help="what goes: heads, neurons, both (the default), or blocks — whole blocks only (depth pruning)",
    )
    p.add_argument(
        "--speedup",
        type=float,
        help="in place of --ratio: how many times faster than dense, measured where the prune runs; the depth and "
        "widths that reach it with the least held-aside loss are kept",
    )
    p.add_argument(
        "--workload",
        choices=["decode_b1", "prefill_b8x512"],
        help="what --speedup times: decode_b1 (the default: batch-1 decoding, ms per token) or prefill_b8x512",
    )
    p.add_argument(
        "--depth-blocks",
        type=int,
        help="whole blocks removed beside the heads and neurons, counted in --ratio (depth.blocks)",
    )
    p.add_argument(
        "--depth-select",
        choices=["loss", "fit", "angular"],
        help="which span of blocks goes: loss (the default: least held-aside loss with the span replaced), fit, "
        "or angular (ShortGPT)",
    )
    p.add_argument(
        "--depth-reconstruction",
        choices=["ls", "none"],
        help="ls (the default): the span replaced by a least-squares linear map folded into the block before; "
        "none: removed",
    )


def add_recipe_flags(p: argparse.ArgumentParser) -> None:
    """The recipe file and the flags that override or replace it (``liar prune``, ``liar jobs submit``)."""
    p.add_argument("recipe", nargs="?", help="recipe YAML (flags below override its fields)")
    p.add_argument("--model", help="Hugging Face id or local directory")
    p.add_argument("--ratio", type=float, help="fraction of transformer-block parameters to remove, in (0, 1)")
    _add_depth_flags(p)
    p.add_argument(
        "--allocation",
        choices=["auto", "uniform", "global"],
        help="auto (the default): what the criterion needs, global with criterion obs, else uniform",
    )
    p.add_argument(
        "--head-ratio",
        type=_head_ratio,
        help="uniform allocation: fraction of each layer's query heads removed, the neurons making up the rest "
        "— auto (default: half the ratio, measured best), same (the layer's ratio, the paper's split), obs (each "
        "layer's split with the least output error on the OBS error curves), or a number in [0, 1)",
    )
    p.add_argument("--query-heads", choices=["free", "uniform"], help="uniform: equal query heads per layer (vLLM)")
    p.add_argument(
        "--round-neurons",
        type=_round_neurons,
        help="kept FFN neurons per layer a multiple of this (round_to.neurons): auto (default: 128 on a GPU, "
        "64 on a CPU), a number, or 1 for exact widths",
    )
    p.add_argument(
        "--kv-groups",
        choices=["free", "whole", "auto"],
        help="grouped-query attention (round_to.kv_groups): whole — drop query heads only as whole key/value "
        "groups, so every layer is a stock GQA attention; free (default) — one at a time, uneven groups "
        "gathered by index; auto — whole on a GPU, free on a CPU",
    )
    p.add_argument(
        "--criterion",
        help="pruning criterion: auto (the default: obs with global allocation for decoders up to 50%%, no layer "
        "losing more than 1.2 x the ratio above 30%%; kwon for an encoder classifier with labelled calibration "
        "data; otherwise uniform shares, flap for a decoder without a refit, magnitude else), "
        "magnitude, random, flap, snip, kwon, taylor, kcm, obs",
    )
    _add_reconstruction_flags(p)
    p.add_argument("--calibration", help="named set (wikitext2, c4, alpaca) or a .txt/.jsonl file")
    p.add_argument("--samples", type=int, help="number of calibration samples")
    p.add_argument("--seq-len", type=int, help="tokens per calibration sample")
    p.add_argument("--holdout", type=int, help="extra samples held aside for the error report")
    p.add_argument(
        "--label-field",
        help="encoders: the field of each .jsonl record holding its task label; a sequence classifier's default "
        "criterion is then Kwon et al.'s Fisher search on the task loss",
    )
    p.add_argument("--seed", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--dtype", choices=DTYPES)
    p.add_argument("--device", help="auto | cpu | cuda | cuda:N")
    p.add_argument(
        "--execution",
        choices=["auto", "stream", "memory"],
        help="stream: one block at a time from the checkpoint's shards, written out as it is pruned (what auto "
        "picks for a model directory or hub id, unless the criterion needs whole-model gradients); memory: the "
        "whole model on the device",
    )
    p.add_argument(
        "--activations",
        choices=["auto", "device", "recompute", "host"],
        help="where the calibration activations live between blocks on a GPU: recompute (on the device, but the "
        "FFN's kept inputs are computed again instead of kept: less memory, ~18%% more block work); host (pinned "
        "host memory, copied in as each block uses them) for calibration sets too big for the device; auto (the "
        "default) picks device, then recompute, then host, the first that fits",
    )
    p.add_argument(
        "--export",
        action="append",
        metavar="FORM",
        help="also write the checkpoint in this serving form after saving it (repeat for several; the recipe's "
        "export): gguf-f16, gguf-q8_0, gguf-q5_k_m, gguf-q4_k_m, gguf-q3_k_m, gguf-iq3_xxs or gguf-iq2_m — GGUF "
        "for llama.cpp and ollama, q4_k_m about a quarter of f16's size, the quantized ones by llama.cpp's "
        "quantizer (liar engines install llama.cpp) with an importance matrix from the calibration text — or vllm, a "
        "folder vLLM serves (needs query_heads: uniform); checked against the model before pruning",
    )


def _add_reconstruction_flags(p: argparse.ArgumentParser) -> None:
    """The ``reconstruction`` section's flags (and ``--paper``, which sets several of them)."""
    p.add_argument("--reconstruction", help="none | bias | mask_tuning | liar | ls (default ls, the exact refit)")
    p.add_argument(
        "--paper",
        action="store_const",
        const=True,
        help="the paper's LIAR: reconstruction liar, the criterion's units (select criterion) and heads pruned at "
        "the layer's ratio (head ratio same) instead of the default ls with reconstruction-aware selection",
    )
    p.add_argument("--damp", type=float, help="ridge damping as a fraction of mean(diag G)")
    p.add_argument(
        "--select",
        choices=["auto", "criterion", "obs"],
        help="which units a layer drops: obs — those the least-squares refit compensates best, chosen on the "
        "calibration statistics; criterion — the criterion's lowest-scored (the paper); auto (the default) — "
        "obs when a least-squares refit follows (ls, liar), else criterion",
    )
    p.add_argument(
        "--target",
        choices=["pruned", "dense"],
        help="refit each pruned layer to its own output on the pruned model's inputs (default), or to the dense "
        "model's output (error feedback; with --reconstruction ls)",
    )
    p.add_argument(
        "--positions",
        choices=["all", "pooled", "first"],
        help="tokens the refit covers: all (default); pooled (encoder classifiers) — all below the last block, "
        "only [CLS], what the classifier reads, in it; first — [CLS] in every block",
    )


def _register_prune(sub) -> None:
    p = sub.add_parser("prune", help="prune a model and save the pruned checkpoint")
    add_recipe_flags(p)
    p.add_argument("--output", "-o", required=True, help="directory for the pruned checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace a non-empty output directory")
    p.add_argument("--ppl", help="also measure perplexity on this named set or text file")
    p.add_argument("--ppl-seq-len", type=int)
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="validate and print the recipe as it will run (criterion auto resolved when the model config is local), "
        "do nothing",
    )
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--quiet", "-q", action="store_true")
    p.set_defaults(func=cmd_prune)


def _target_choice(summary: dict) -> str:
    """How a speed target's model was chosen among its timed prunes (``core/pipeline/target.py``)."""
    n = len(summary["target_candidates"])
    prunes = f"{n} timed prunes" if n > 1 else "its one timed prune"
    if summary.get("target_reached") is False:
        return f"NOT reached: none of {prunes} realised it; kept the fastest"
    return f"kept the least held-aside loss among {prunes} that reach it" if n > 1 else f"kept {prunes}"
