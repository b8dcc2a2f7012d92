"""lm-eval on a checkpoint read block by block (``core.evaluation.lmeval_streamed``) against the
harness's own ``HFLM`` on the same model in memory."""

import pytest
import torch
from lm_eval.api.instance import Instance
from lm_eval.models.huggingface import HFLM

from core import prune
from core.evaluation.lmeval import evaluate_lm_eval, write_rt_sentiment_task, write_wiki_cloze_task
from core.evaluation.lmeval_streamed import StreamedLM, evaluate_lm_eval_streamed
from core.evaluation.streamed import open_decoder
from core.models.loading import load_model
from tests.conftest import recipe_for


@pytest.fixture(scope="module")
def pruned_dir(llama_dir, corpus, tmp_path_factory):
    """A tiny Llama pruned unevenly (40%, global ranking) by a streamed run: the checkpoint a big model's
    job leaves behind, with layers of different widths."""
    out = tmp_path_factory.mktemp("pruned") / "llama"
    recipe = recipe_for(llama_dir, corpus, ratio=0.4, allocation="global", device="cpu", execution="stream")
    prune(recipe, output_dir=out).save(out)
    return out


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, corpus):
    d = tmp_path_factory.mktemp("tasks")
    reviews = [{"text": t, "label": i % 2} for i, t in enumerate(corpus[10:16])]
    write_rt_sentiment_task(d, reviews)
    write_wiki_cloze_task(d, corpus[:8], items_per_passage=2, seed=3)
    return d


def _requests(kind: str, args: list[tuple]) -> list[Instance]:
    return [Instance(request_type=kind, doc={}, arguments=a, idx=i) for i, a in enumerate(args)]


def _pair_requests(corpus) -> list[Instance]:
    """Contexts with continuations of one and several tokens, choices sharing their model input, an
    empty context (the prefix token), a trailing space moved to the continuation, and a context
    longer than the model's 256 positions (left-truncated)."""
    long_context = " ".join(corpus) * 2
    args = [
        (corpus[0], " the"),
        (corpus[0], " a"),  # the same model input as the one above: one row, two reads
        (corpus[1][:40], corpus[1][40:90]),
        (corpus[2][:30] + " ", "world of science"),
        ("", corpus[3][:50]),
        (long_context, " and more words here"),
    ]
    args += [(corpus[5 + i][:25], corpus[5 + i][25 : 25 + 7 * (i + 1)]) for i in range(6)]
    return _requests("loglikelihood", args)


def test_streamed_log_likelihoods_equal_the_harness_in_memory(pruned_dir, corpus):
    model, tok, _ = load_model(str(pruned_dir), "float32", "cpu")
    reference = HFLM(pretrained=model, tokenizer=tok, backend="causal", batch_size=3)
    if reference.max_length >= len(tok(" ".join(corpus) * 2)["input_ids"]):
        pytest.fail("the long context must exceed the model's positions to test truncation")
    requests = _pair_requests(corpus)
    expected = reference.loglikelihood(requests)
    rolling = _requests("loglikelihood_rolling", [(corpus[20],), (" ".join(corpus[:30]),)])  # the second spans windows
    expected_rolling = reference.loglikelihood_rolling(rolling)
    for pass_bytes in (None, 4 * 64 * 40):  # one pass; passes of a few short rows each
        sm = open_decoder(pruned_dir, "float32", "cpu")
        try:
            lm = StreamedLM(sm, tok, batch_size=3, pass_bytes=pass_bytes)
            got = lm.loglikelihood(requests)
            passes = lm.passes
            got_rolling = lm.loglikelihood_rolling(rolling)
        finally:
            sm.close()
        assert [g for _, g in got] == [g for _, g in expected]
        assert torch.allclose(torch.tensor([v for v, _ in got]), torch.tensor([v for v, _ in expected]), atol=1e-4)
        assert torch.allclose(torch.tensor(got_rolling), torch.tensor(expected_rolling), rtol=1e-5)
        assert passes == 1 if pass_bytes is None else passes > 2
        if pass_bytes is None:  # every rolling window of every request in one pass too
            assert lm.passes == 2


def test_streamed_tasks_equal_the_in_memory_tasks(pruned_dir, task_dir):
    memory = evaluate_lm_eval(str(pruned_dir), None, "rt_sentiment,wiki_cloze", task_dir=task_dir, device="cpu")
    streamed = evaluate_lm_eval_streamed(pruned_dir, "rt_sentiment,wiki_cloze", task_dir=task_dir, device="cpu")
    assert set(streamed["summary"]) == set(memory["summary"]) == {"rt_sentiment", "wiki_cloze"}
    for task, metrics in memory["summary"].items():
        assert streamed["summary"][task] == pytest.approx(metrics)
    assert streamed["raw"]["n-samples"] == memory["raw"]["n-samples"]
    assert streamed["parameters"] == memory["parameters"] and streamed["passes"] == 1


def test_generation_tasks_and_encoders_are_refused_before_reading(pruned_dir, bert_dir, task_dir, tmp_path):
    (tmp_path / "echo.jsonl").write_text('{"text": "say yes", "label": "yes"}\n')
    (tmp_path / "echo.yaml").write_text(
        "task: echo\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: "
        f"{tmp_path / 'echo.jsonl'}\ntest_split: test\noutput_type: generate_until\n"
        "doc_to_text: '{{text}}'\ndoc_to_target: '{{label}}'\ngeneration_kwargs:\n  until: ['\\n']\n"
        "metric_list:\n  - metric: exact_match\n"
    )
    with pytest.raises(ValueError, match="echo generate text, which a streamed evaluation cannot do"):
        evaluate_lm_eval_streamed(pruned_dir / "no-such-dir", "echo", task_dir=tmp_path, device="cpu")
    with pytest.raises(ValueError, match="lm-eval tasks needs a causal language model"):
        evaluate_lm_eval_streamed(bert_dir, "rt_sentiment", task_dir=task_dir, device="cpu")
