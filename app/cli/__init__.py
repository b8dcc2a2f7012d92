"""The ``liar`` command: one parser, each verb group registering its subcommands on it.

    liar prune | eval | demo     one model: prune it, evaluate it, or try the install  (app.cli.prune)
    liar estimate                a recipe's size, peak memory and time on a worker class (app.cli.estimate)
    liar export | engines        a checkpoint for llama.cpp (GGUF), and the engines   (app.cli.export)
    liar sweep                   a resumable grid of runs → tables and plots            (app.cli.sweep)
    liar worker | jobs …         the job runner: a worker, and submit/list/show/cancel  (app.cli.jobs)
    liar app                     the web app with an embedded worker                    (app.cli.serve)
    liar users                   the web app's accounts, as password hashes             (app.cli.users)
    liar health                  database, broker and workers answering? (exit 1 if not) (app.cli.health)

Heavy libraries (torch, transformers, gradio) are imported inside the verbs, so ``liar --help`` is fast.
"""

from __future__ import annotations

import argparse
import os
import sys

from app.cli import estimate, export, health, jobs, prune, serve, sweep, users
from app.cli.common import configure_engine, fail, quiet_transformers

VERB_GROUPS = (prune, estimate, export, sweep, jobs, serve, users, health)  # the order of the verbs in ``liar --help``
ENGINE_VERBS = ("prune", "eval", "demo", "sweep")  # verbs that load models in this process


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="liar", description="Retraining-free structured pruning with least-squares reconstruction."
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for group in VERB_GROUPS:
        group.register(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``liar`` console script; returns the exit code."""
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
    args = build_parser().parse_args(argv)
    if args.command in ENGINE_VERBS:
        quiet_transformers()
        error = configure_engine()
        if error is not None:
            return fail(error)
    try:
        return args.func(args)
    except BrokenPipeError:  # `liar jobs list | head`: the reader left; stop quietly, as Unix tools do
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so the interpreter's final flush does not complain
        return 0


if __name__ == "__main__":
    sys.exit(main())
