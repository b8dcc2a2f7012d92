"""``liar estimate``: what a recipe's run will take on a worker class, before it is submitted.

    liar estimate RECIPE.yaml [--worker h100-80gb] [--json]

Prints the engine's own estimate (``core/pipeline/estimate.py``) in one line — parameters after pruning,
peak memory, time — and, when the run does not fit the class, the sentence saying so. Reads the
model's config from a local directory or the local Hugging Face cache only: nothing is downloaded.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict

from app.cli.common import fail

# core.pipeline.estimate.WORKERS, spelled here so that ``liar --help`` imports nothing of the engine
# (tests/app/test_estimate_cli.py checks that the two agree)
WORKER_CHOICES = ("cpu", "a100-80gb", "h100-80gb")


def cmd_estimate(args: argparse.Namespace) -> int:
    from pydantic import ValidationError

    from core.pipeline.estimate import estimate
    from core.spec.errors import validation_message
    from core.spec.recipe import Recipe

    try:
        recipe = Recipe.load(args.recipe)
    except ValidationError as exc:
        return fail(f"invalid recipe: {validation_message(exc)}")
    except (ValueError, OSError) as exc:
        return fail(str(exc))
    result = estimate(recipe, args.worker)
    if not result.ok:
        return fail(result.error)
    if args.json:
        print(json.dumps({**asdict(result), "flops": dict(result.flops), "summary": result.summary()}, indent=2))
        return 0
    print(result.summary())
    if not result.fits:
        print(result.fit_note)
    return 0


def register(sub) -> None:
    """Add ``estimate`` to the ``liar`` subcommands."""
    p = sub.add_parser(
        "estimate", help="estimate a recipe's parameters after pruning, peak memory and time on a worker class"
    )
    p.add_argument("recipe", help="the recipe (YAML)")
    p.add_argument("--worker", default="h100-80gb", choices=WORKER_CHOICES, help="worker class (default h100-80gb)")
    p.add_argument("--json", action="store_true", help="print every field of the estimate as JSON")
    p.set_defaults(func=cmd_estimate)
