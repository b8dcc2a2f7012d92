"""``liar eval``: perplexity and lm-eval tasks of a model or pruned checkpoint, in memory or read block
by block (``--stream``, for a model bigger than the device).

    liar eval DIR --ppl FILE --seq-len 128 --json
    liar eval DIR --tasks rt_sentiment,wiki_cloze --task-dir TASKS --limit 200 --json
    liar eval DIR --stream --ppl wikitext2 --tasks piqa,arc_easy
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.cli.common import DTYPES, fail, run_quietly


def cmd_eval(args: argparse.Namespace) -> int:
    """Perplexity (``--ppl``) and/or lm-eval tasks (``--tasks``) of a model or pruned checkpoint."""
    from core.models.loading import load_model

    tasks = None
    if args.task_dir is not None and args.tasks is None:
        return fail("--task-dir needs --tasks")
    if args.ppl is None and args.tasks is None:
        return fail("nothing to evaluate: pass --ppl FILE_OR_NAMED_SET and/or --tasks NAME[,NAME...]")
    if args.tasks is not None:  # resolve names before loading the model: a typo fails in a second
        from core.evaluation.tasks import select_tasks

        try:
            tasks = select_tasks(args.tasks, args.task_dir)
        except (ValueError, FileNotFoundError) as exc:
            return fail(str(exc))
    quiet = args.json or args.quiet
    if args.stream:
        return _eval_streamed(args, tasks, quiet)
    result: dict = {}
    try:
        model, tokenizer, adapter = load_model(args.model, args.dtype, args.device)
        if adapter.kind != "decoder":
            what = "perplexity" if args.ppl is not None else "lm-eval tasks"
            return fail(f"{what} needs a causal language model (decoder)")
        if args.ppl is not None:
            from core.evaluation.perplexity import perplexity

            result.update(perplexity(model, tokenizer, args.ppl, **_ppl_window_args(args, quiet)))
        if tasks is not None:
            result.update(_run_tasks(args, model, tokenizer, tasks, quiet))
    except (ValueError, RuntimeError, FileNotFoundError) as exc:
        return fail(str(exc))
    result["parameters"] = sum(p.numel() for p in model.parameters())
    return _report_eval(args, result)


def _ppl_window_args(args: argparse.Namespace, quiet: bool) -> dict:
    return dict(seq_len=args.seq_len, batch_size=args.batch_size, max_windows=args.max_windows, show_progress=not quiet)


def _report_eval(args: argparse.Namespace, result: dict) -> int:
    result["model"] = args.model
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_eval(result, args.seq_len)
    return 0


def _eval_streamed(args: argparse.Namespace, tasks, quiet: bool) -> int:
    """``liar eval --stream``: perplexity and/or log-likelihood tasks block by block, for a model
    bigger than the device."""
    from core.evaluation.perplexity import perplexity_streamed
    from core.models.streaming import checkpoint_directory

    directory = checkpoint_directory(args.model)
    if directory is None:
        return fail(f"{args.model!r} is neither a local directory nor a hub model reachable from this machine")
    result: dict = {}
    try:
        if args.ppl is not None:
            result.update(
                perplexity_streamed(
                    directory, None, args.ppl, device=args.device, dtype=args.dtype, **_ppl_window_args(args, quiet)
                )
            )
        if tasks is not None:
            from core.evaluation.lmeval_streamed import evaluate_lm_eval_streamed

            options = dict(batch_size=args.batch_size, limit=args.limit, num_fewshot=args.num_fewshot)
            options.update(device=args.device, dtype=args.dtype, show_progress=not quiet)
            harness = run_quietly(quiet, evaluate_lm_eval_streamed, directory, tasks, **options)
            result.update(_tasks_result(args, harness), parameters=harness["parameters"])
    except (ValueError, RuntimeError, OSError) as exc:
        return fail(str(exc))
    return _report_eval(args, result)


def _run_tasks(args: argparse.Namespace, model, tokenizer, tasks, quiet: bool) -> dict:
    """lm-eval on ``tasks``: their summary and time (and the raw results in ``--results``)."""
    from core.evaluation.lmeval import evaluate_lm_eval

    harness = run_quietly(
        quiet,
        evaluate_lm_eval,
        model,
        tokenizer,
        tasks,
        batch_size=args.batch_size,
        limit=args.limit,
        num_fewshot=args.num_fewshot,
    )
    return _tasks_result(args, harness)


def _tasks_result(args: argparse.Namespace, harness: dict) -> dict:
    """The task summary and time of an lm-eval run (its raw results written to ``--results``)."""
    if args.results:
        Path(args.results).expanduser().write_text(json.dumps(harness["raw"], indent=2))
    out = {"tasks": harness["summary"], "lm_eval_seconds": harness["seconds"]}
    return out | ({"model_reads": harness["passes"]} if "passes" in harness else {})


def _print_eval(result: dict, seq_len: int) -> None:
    if "perplexity" in result:
        print(
            f"perplexity {result['perplexity']:.4f} over {result['tokens']:,} tokens "
            f"({result['windows']} windows of {seq_len})"
        )
    for task, metrics in result.get("tasks", {}).items():
        shown = ", ".join(
            f"{k} {v:.4f}" + (f" ± {metrics[k + '_stderr']:.4f}" if k + "_stderr" in metrics else "")
            for k, v in metrics.items()
            if not k.endswith("_stderr")
        )
        print(f"{task}: {shown}")


def limit_arg(value: str) -> int | float:
    """``--limit``: a positive count of examples, or a fraction in (0, 1)."""
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {value!r}") from None
    if number <= 0:
        raise argparse.ArgumentTypeError("must be positive")
    if number < 1:
        return number
    if not number.is_integer():
        raise argparse.ArgumentTypeError("a count of examples must be a whole number (or a fraction below 1)")
    return int(number)


def register_eval(sub) -> None:
    """Add ``eval`` to the ``liar`` subcommands."""
    e = sub.add_parser("eval", help="evaluate a model or pruned checkpoint (perplexity, lm-eval tasks)")
    e.add_argument("model", help="checkpoint directory or Hugging Face id")
    e.add_argument("--ppl", help="named set (wikitext2) or a .txt/.jsonl file")
    e.add_argument("--seq-len", type=int, default=512)
    e.add_argument("--batch-size", type=int, default=4)
    e.add_argument("--max-windows", type=int)
    e.add_argument(
        "--tasks",
        help="comma-separated lm-eval tasks: local ones in --task-dir (rt_sentiment, wiki_cloze) or registry "
        "names (boolq, piqa, hellaswag, winogrande, arc_easy, arc_challenge, openbookqa: need the Hub)",
    )
    e.add_argument(
        "--task-dir", help="directory of local task YAMLs (see core.evaluation.lmeval; bench.assets builds one)"
    )
    e.add_argument("--limit", type=limit_arg, help="examples per task: a count, or a fraction below 1")
    e.add_argument("--num-fewshot", type=int, help="few-shot examples per prompt (default: the task's, else 0)")
    e.add_argument("--results", help="also write lm-eval's whole results object to this JSON file")
    e.add_argument(
        "--stream",
        action="store_true",
        help="read the model one block at a time, for models bigger than the device: perplexity, and lm-eval "
        "tasks scored by log-likelihood (not generation tasks)",
    )
    e.add_argument("--dtype", default="auto", choices=DTYPES)
    e.add_argument("--device", default="auto")
    e.add_argument("--json", action="store_true", help="print a JSON object")
    e.add_argument("--quiet", "-q", action="store_true")
    e.set_defaults(func=cmd_eval)
