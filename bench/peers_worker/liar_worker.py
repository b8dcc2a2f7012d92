"""Our side of the peer benchmark: ``core.prune`` with a recipe built by ``bench/peers.py``.

Runs in the project's own environment. It prunes as ``liar prune --output DIR`` does (``prune``
with an output directory, then ``result.save``: streamed where the recipe allows it) and loads the
checkpoint back with ``core.load_pruned``; the harness in ``common`` then measures it like every
peer's model.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import common  # noqa: E402


def prune(cell: dict) -> dict:
    from core import Recipe, load_pruned
    from core import prune as liar_prune

    recipe = Recipe.model_validate(cell["recipe"])
    out = Path(tempfile.mkdtemp(prefix="liar-peers-")) / "pruned"
    result = liar_prune(recipe, output_dir=str(out), overwrite=True)  # as app/cli/prune.py does
    result.save(str(out), overwrite=True)
    model, tok = load_pruned(out)
    shutil.rmtree(out.parent, ignore_errors=True)  # the weights are in memory now
    summary = result.summary()
    knobs = {
        # as it ran: criterion / allocation auto resolved (what the table's knobs column shows)
        "recipe": result.recipe.model_dump(mode="json", exclude_none=True),
        "achieved_ratio": summary["achieved_ratio"],
        "execution": summary.get("execution"),
        "round_to_neurons": summary.get("round_to_neurons"),
    }
    return {"model": model, "tokenizer": tok, "knobs": knobs}


if __name__ == "__main__":
    common.main(prune, ["liar-prune"])
