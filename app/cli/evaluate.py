"""``liar eval``: perplexity and lm-eval tasks of a model or pruned checkpoint (``core.evaluate``): in
memory, or read block by block when it would not fit on its device or ``--stream`` asks.

    liar eval DIR --ppl FILE --seq-len 128 --json
    liar eval DIR --tasks rt_sentiment,wiki_cloze --task-dir TASKS --limit 200 --json
    liar eval DIR --stream --ppl wikitext2 --tasks piqa,arc_easy
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from app.cli.common import DTYPES, PERPLEXITY_KEYS, fail, run_quietly


def cmd_eval(args: argparse.Namespace) -> int:
    """Perplexity (``--ppl``) and/or lm-eval tasks (``--tasks``) of a model or pruned checkpoint,
    through ``core.evaluate`` (which loads it whole, or reads it block by block when it would not fit
    or ``--stream`` asks)."""
    if args.task_dir is not None and args.tasks is None:
        return fail("--task-dir needs --tasks")
    if args.ppl is None and args.tasks is None:
        return fail("nothing to evaluate: pass --ppl FILE_OR_NAMED_SET and/or --tasks NAME[,NAME...]")
    from core.evaluation.run import evaluate

    specs = []
    if args.ppl is not None:
        windows = dict(seq_len=args.seq_len, batch_size=args.batch_size, max_windows=args.max_windows)
        specs.append({"type": "perplexity", "text": args.ppl, **windows})
    if args.tasks is not None:  # names are resolved before the model is read: a typo fails in a second
        options = dict(task_dir=args.task_dir, limit=args.limit, num_fewshot=args.num_fewshot)
        specs.append({"type": "lm_eval", "tasks": args.tasks, "batch_size": args.batch_size, **options})
    quiet = args.json or args.quiet
    where = dict(device=args.device, dtype=args.dtype, execution="stream" if args.stream else "auto")
    try:
        results = run_quietly(quiet, evaluate, args.model, specs, show_progress=not quiet, **where)
    except (ValueError, RuntimeError, OSError) as exc:
        return fail(str(exc))
    report: dict = {}
    for spec, out in zip(specs, results):
        if spec["type"] == "perplexity":
            report.update({key: out[key] for key in PERPLEXITY_KEYS})
        else:
            report.update(_tasks_result(args, out))
        if "parameters" in out:
            report["parameters"] = out["parameters"]
    return _report_eval(args, report)


def _report_eval(args: argparse.Namespace, result: dict) -> int:
    result["model"] = args.model
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        _print_eval(result, args.seq_len)
    return 0


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
