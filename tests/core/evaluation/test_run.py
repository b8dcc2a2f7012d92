"""``core.evaluate``: one entry point that measures a prune's result or a checkpoint in memory or block
by block, as it decides, with the numbers of the functions it calls."""

from __future__ import annotations

import pytest

import core
from core.evaluation import run
from core.evaluation.perplexity import perplexity, perplexity_streamed
from tests.conftest import recipe_for


@pytest.fixture
def text_file(corpus, tmp_path):
    path = tmp_path / "eval.txt"
    path.write_text("\n\n".join(corpus[:10]))
    return path


def _spec(text_file, **kw):
    return {"type": "perplexity", "text": str(text_file), "seq_len": 16, "batch_size": 3, **kw}


def test_a_result_in_memory_or_streamed_gives_the_direct_functions_perplexity(llama_dir, corpus, text_file, tmp_path):
    recipe = recipe_for(llama_dir, corpus, dtype="float32", device="cpu")
    held = core.prune(recipe)
    assert held.metrics["execution"] == "memory"
    got = core.evaluate(held, _spec(text_file))
    want = perplexity(held.model, held.tokenizer, str(text_file), seq_len=16, batch_size=3)
    assert {k: got[k] for k in want} == want and got["parameters"] == held.params_after

    streamed = core.prune(recipe, output_dir=tmp_path / "out")
    assert streamed.metrics["execution"] == "stream" and streamed.model is None
    got = core.evaluate(streamed, [_spec(text_file), _spec(text_file, max_windows=2)])
    want = perplexity_streamed(streamed.checkpoint, streamed.tokenizer, str(text_file), seq_len=16, batch_size=3)
    assert got[0] == want and got[1]["windows"] == 2
    saved = streamed.save(tmp_path / "saved")
    whole = core.evaluate(saved, _spec(text_file), device="cpu", execution="memory")
    blocks = core.evaluate(saved, _spec(text_file), device="cpu", execution="stream")
    assert whole["perplexity"] == pytest.approx(want["perplexity"], rel=1e-5)
    assert blocks["perplexity"] == pytest.approx(whole["perplexity"], rel=1e-5)
    with pytest.raises(ValueError, match="already saved or discarded"):
        core.evaluate(streamed, _spec(text_file))


def test_a_checkpoint_that_would_not_fit_is_read_block_by_block(llama_dir, text_file, monkeypatch):
    import core.evaluation.perplexity as ppl

    calls = []
    monkeypatch.setattr(ppl, "perplexity_streamed", lambda *a, **k: calls.append("stream") or {"perplexity": 1.0})
    monkeypatch.setattr(ppl, "perplexity", lambda *a, **k: calls.append("memory") or {"perplexity": 1.0})
    core.evaluate(llama_dir, _spec(text_file), device="cpu")
    monkeypatch.setattr(run, "_fits", lambda directory, device: False)
    core.evaluate(llama_dir, _spec(text_file), device="cpu")
    assert calls == ["memory", "stream"]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ({"type": "perplexity", "text": "no/such/file.txt"}, r"^invalid evaluation: dataset: .*nor an existing file$"),
        ({"type": "perplexity", "text": "wikitext2", "seq_len": 1}, r"^invalid evaluation: seq_len: "),
        ({"type": "bleu"}, r"^unknown evaluation type 'bleu': one of perplexity, lm_eval$"),
        ({"type": "lm_eval", "tasks": []}, r"^invalid evaluation: tasks: "),
        ("wikitext2", r"^an evaluation is a mapping with a 'type', not str$"),
        ([], r"^nothing to evaluate"),
    ],
)
def test_a_bad_spec_is_refused_in_one_sentence_before_any_model_is_read(spec, message):
    with pytest.raises(ValueError, match=message) as exc:
        core.evaluate("/no/model/here", spec)
    assert "\n" not in str(exc.value)


def test_what_cannot_be_evaluated_is_refused_in_one_sentence(llama_dir, text_file):
    with pytest.raises(
        ValueError, match=r"^evaluate takes a prune's result or a checkpoint directory / hub id, not int$"
    ):
        core.evaluate(42, _spec(text_file))


def test_an_unknown_execution_is_refused(llama_dir, text_file):
    with pytest.raises(ValueError, match=r"^execution must be one of auto, memory, stream, not 'gpu'$"):
        core.evaluate(llama_dir, _spec(text_file), execution="gpu")
