"""What a serving file costs in quality: held-out perplexity of a GGUF file, scored by llama.cpp itself
on the windows a prune's own perplexity evaluation scored.

The windows are ``core.evaluation.perplexity``'s (the checkpoint's tokenizer over the evaluation
text, consecutive windows of ``seq_len`` tokens), handed to llama.cpp as token ids (the worker's
``nll`` op, from llama.cpp's logits), so a file's perplexity and the checkpoint's own are over the same
tokens. Scoring runs a forward pass of the file per window on the worker, so a file is scored on at
most :data:`EVAL_TOKENS` tokens: the first windows of the evaluation, which :class:`Windows` says.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace

EVAL_TOKENS = 16_384  # tokens scored per file at most (32 windows of 512; not yet timed on a large model)


@dataclass(frozen=True)
class Windows:
    """The evaluation windows a file is scored on."""

    ids: list[list[int]]  # the windows scored, token ids
    total: int  # windows in the whole evaluation
    seq_len: int
    budget: int = EVAL_TOKENS  # tokens a file is scored on at most

    @property
    def subset(self) -> bool:
        """Whether only the first windows are scored (the whole evaluation is over the budget)."""
        return len(self.ids) < self.total

    def describe(self, text: str) -> str:
        """``the 40 windows of 512 tokens of eval.txt``, or which of them when a subset."""
        if self.subset:
            return (
                f"the first {len(self.ids)} of the {self.total} windows of {self.seq_len} tokens of {text} "
                f"(at most {self.budget:,} tokens a file: the whole would take too long in llama.cpp on a CPU)"
            )
        return f"the {self.total} window{'s' * (self.total != 1)} of {self.seq_len} tokens of {text}"


def held_out_windows(
    checkpoint: str | Path,
    text: str | Path | list[str],
    seq_len: int = 512,
    max_windows: int | None = None,
    budget: int | None = None,
) -> Windows:
    """The windows of ``text`` that the perplexity evaluation ``(seq_len, max_windows)`` of the checkpoint
    in ``checkpoint`` scores (with its tokenizer), cut to the first ``budget // seq_len`` (at least one;
    ``budget`` None: :data:`EVAL_TOKENS`)."""
    from transformers import AutoTokenizer, PretrainedConfig

    from core.evaluation.perplexity import eval_windows
    from core.models.config_file import read_config

    raw = read_config(checkpoint)
    limit = raw.get("max_position_embeddings") or (raw.get("text_config") or {}).get("max_position_embeddings")
    # the tokenizer's own files say its class; a config spares it reading config.json (remote code)
    tokenizer = AutoTokenizer.from_pretrained(checkpoint, config=PretrainedConfig())
    budget = EVAL_TOKENS if budget is None else budget
    every = eval_windows(SimpleNamespace(max_position_embeddings=limit), tokenizer, text, seq_len, max_windows)
    return Windows(every[: max(1, budget // seq_len)], len(every), seq_len, budget)


def gguf_perplexity(path: str | Path, windows: Windows, threads: int = 2) -> dict[str, float]:
    """The GGUF file's perplexity over ``windows`` in llama.cpp: ``{"perplexity", "nll", "tokens"}``
    (``nll``: the mean over the predicted tokens, as ``core.evaluation.perplexity``'s); ``EngineError``
    where llama.cpp is missing or fails."""
    from core.serving.engines import call_llama_cpp

    got = call_llama_cpp({"op": "nll", "model": str(path), "windows": windows.ids, "threads": threads})
    mean = got["nll"] / got["tokens"]
    return {"perplexity": math.exp(mean), "nll": mean, "tokens": got["tokens"]}


def checkpoint_perplexity(checkpoint: str | Path, text: str | Path | list[str], windows: Windows) -> float:
    """The checkpoint's own perplexity (torch, ``core.evaluate``: whole or block by block as it fits)
    over the same windows: the reference a subset of the evaluation is compared with."""
    from core.evaluation.run import evaluate

    spec = {"type": "perplexity", "dataset": text, "seq_len": windows.seq_len, "max_windows": len(windows.ids)}
    return float(evaluate(str(checkpoint), spec)["perplexity"])
