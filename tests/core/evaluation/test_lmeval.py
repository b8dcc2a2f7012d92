"""lm-eval on in-memory pruned models with the offline local tasks; builders, task lookup and errors."""

import json
import re

import pytest
import torch

from core import prune
from core.evaluation.lmeval import (
    cloze_items,
    evaluate_lm_eval,
    write_cloze_task,
    write_rt_sentiment_task,
    write_wiki_cloze_task,
)
from core.evaluation.tasks import LOCAL_TASKS, PAPER_TASKS, select_tasks
from core.models.loading import load_model
from tests.conftest import recipe_for

REVIEWS = [
    {"text": "A great fun film with a bright story.", "label": 1},
    {"text": "Dull plot, boring actor, bad scene.", "label": 0},
    {"text": "Good music and a great city story.", "label": "positive"},
    {"text": "Slow and dark; the plot is bad.", "label": "rotten"},
    {"text": "Fun movie.", "label": True},
]


@pytest.fixture(scope="module")
def pruned(llama_dir, corpus):
    """A tiny Llama pruned in memory by 40% (heads and neurons, globally ranked: uneven across layers)."""
    model, tok, _ = load_model(str(llama_dir), "float32", "cpu")
    before = sum(p.numel() for p in model.parameters())
    result = prune(recipe_for(llama_dir, corpus, ratio=0.4, allocation="global"), model=model, tokenizer=tok)
    assert result.params_after < before
    widths = {(ly.self_attn.o_proj.in_features, ly.mlp.down_proj.in_features) for ly in result.model.model.layers}
    assert len(widths) > 1  # layers of different widths: no stock config can describe this model
    return result.model, result.tokenizer


@pytest.fixture(scope="module")
def task_dir(tmp_path_factory, corpus):
    d = tmp_path_factory.mktemp("tasks")
    write_rt_sentiment_task(d, REVIEWS)
    write_wiki_cloze_task(d, corpus[:8], items_per_passage=2, seed=3)
    return d


def _loglikelihood(model, tok, context: str, continuation: str) -> float:
    """Sum of log p(continuation tokens | context), computed directly."""
    ids = tok(context + continuation, add_special_tokens=False)["input_ids"]
    n_ctx = len(tok(context, add_special_tokens=False)["input_ids"])
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), -1)
    return sum(float(logp[i - 1, ids[i]]) for i in range(n_ctx, len(ids)))


@pytest.mark.slow
def test_local_tasks_on_pruned_model_match_direct_loglikelihoods(pruned, task_dir, corpus):
    model, tok = pruned
    out = evaluate_lm_eval(model, tok, ["rt_sentiment", "wiki_cloze"], task_dir=task_dir, batch_size=3)
    summary = out["summary"]
    assert set(summary) == {"rt_sentiment", "wiki_cloze"}
    for metrics in summary.values():
        assert 0.0 <= metrics["acc"] <= 1.0
    assert 0.0 <= summary["wiki_cloze"]["acc_norm"] <= 1.0
    raw = out["raw"]
    json.dumps(raw)  # the whole harness object survives as JSON
    assert raw["n-samples"]["rt_sentiment"]["effective"] == len(REVIEWS)
    assert raw["results"]["wiki_cloze"]["acc,none"] == summary["wiki_cloze"]["acc"]
    # the harness's accuracy equals an argmax over log-likelihoods computed here by hand
    items = cloze_items(corpus[:8], items_per_passage=2, seed=3)
    assert raw["n-samples"]["wiki_cloze"]["effective"] == len(items) == 16
    hits = 0
    for item in items:
        scores = [_loglikelihood(model, tok, item["context"], " " + c) for c in item["choices"]]
        hits += max(range(len(scores)), key=scores.__getitem__) == item["label"]
    assert summary["wiki_cloze"]["acc"] == pytest.approx(hits / len(items))
    assert out["parameters"] == sum(p.numel() for p in model.parameters())


def test_limit_caps_examples(pruned, task_dir):
    model, tok = pruned
    out = evaluate_lm_eval(model, tok, "rt_sentiment", task_dir=task_dir, limit=2)
    assert out["raw"]["n-samples"]["rt_sentiment"]["effective"] == 2
    assert out["summary"]["rt_sentiment"]["acc"] in (0.0, 0.5, 1.0)


def test_cloze_items_are_seeded_next_words_with_distinct_distractors(corpus):
    items = cloze_items(corpus[:5], items_per_passage=3, min_context_words=10, max_context_words=20, seed=1)
    assert items == cloze_items(corpus[:5], items_per_passage=3, min_context_words=10, max_context_words=20, seed=1)
    assert items != cloze_items(corpus[:5], items_per_passage=3, min_context_words=10, max_context_words=20, seed=2)
    assert len(items) == 15
    for item in items:
        gold = item["choices"][item["label"]]
        assert len(item["choices"]) == 5 and len(set(item["choices"])) == 5
        assert all(re.fullmatch(r"[a-z]+", c) for c in item["choices"])
        # the context is a stretch of some passage, and the gold word follows it there
        assert any(item["context"] + " " + gold in doc for doc in corpus[:5])
        assert 10 <= len(item["context"].split()) <= 20
    assert len({i["label"] for i in items}) > 1  # the gold answer is not always in the same place


def test_builders_name_bad_records(tmp_path):
    with pytest.raises(ValueError, match=r"sentiment record 2 has no field 'label'"):
        write_rt_sentiment_task(tmp_path, [{"text": "fine", "label": 1}, {"text": "no label"}])
    with pytest.raises(ValueError, match=r"sentiment record 1: the label is not 0/1"):
        write_rt_sentiment_task(tmp_path, [{"text": "fine", "label": "meh"}])
    with pytest.raises(ValueError, match=r"cloze record 1: 'label' must index 'choices'"):
        write_cloze_task(tmp_path, [{"context": "the", "choices": ["a", "b"], "label": 2}])
    with pytest.raises(ValueError, match="distinct lower-case words"):
        cloze_items(["the the the the"], min_context_words=1)
    assert not list(tmp_path.iterdir())  # nothing written on bad input


def test_rewriting_a_task_replaces_its_data(tmp_path):
    write_rt_sentiment_task(tmp_path, REVIEWS[:2])
    first = sorted(p.name for p in tmp_path.glob("rt_sentiment.*.jsonl"))
    write_rt_sentiment_task(tmp_path, REVIEWS, fewshot_records=REVIEWS[:1])
    files = sorted(p.name for p in tmp_path.glob("rt_sentiment.*.jsonl"))
    assert len(files) == 2 and not set(first) & set(files)
    yml = (tmp_path / "rt_sentiment.yaml").read_text()
    assert "fewshot_split: train" in yml and all(f in yml for f in files)


def test_task_lookup_errors(tmp_path, task_dir):
    sentiment_only = tmp_path / "only"
    write_rt_sentiment_task(sentiment_only, REVIEWS)
    with pytest.raises(ValueError, match=r"'wiki_cloze' is a local task but no wiki_cloze.yaml was found"):
        select_tasks("rt_sentiment,wiki_cloze", sentiment_only)
    with pytest.raises(FileNotFoundError, match="task directory"):
        select_tasks(["rt_sentiment"], tmp_path / "missing")
    with pytest.raises(ValueError, match="no task given"):
        select_tasks(" , ", task_dir)
    selection = select_tasks("wiki_cloze, rt_sentiment ,wiki_cloze", task_dir)
    assert selection.names == ["wiki_cloze", "rt_sentiment"] and selection.local >= set(LOCAL_TASKS)


def test_paper_tasks_are_known_and_fail_clearly_offline(pruned, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    selection = select_tasks(list(PAPER_TASKS))
    assert selection.names == list(PAPER_TASKS) and not selection.local
    model, tok = pruned
    with pytest.raises(RuntimeError, match=r"'piqa'.*Hugging Face Hub.*Local tasks \(rt_sentiment, wiki_cloze\)"):
        evaluate_lm_eval(model, tok, ["piqa"])


def test_encoders_are_refused(bert_dir, task_dir):
    model, tok, _ = load_model(str(bert_dir), "float32", "cpu")
    with pytest.raises(ValueError, match="causal language model"):
        evaluate_lm_eval(model, tok, ["rt_sentiment"], task_dir=task_dir)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["gemma3", "phi3"])
def test_lm_eval_on_newer_families_matches_direct_loglikelihoods(name, request, task_dir, corpus):
    """Gemma 3 (sliding-window layers, q/k norms) and Phi-3 (fused projections), pruned unevenly."""
    model_dir = request.getfixturevalue(f"{name}_dir")
    result = prune(recipe_for(model_dir, corpus, ratio=0.4, allocation="global"))
    model, tok = result.model, result.tokenizer
    out = evaluate_lm_eval(model, tok, ["wiki_cloze"], task_dir=task_dir, batch_size=3)
    items = cloze_items(corpus[:8], items_per_passage=2, seed=3)
    hits = 0
    for item in items:
        scores = [_loglikelihood(model, tok, item["context"], " " + c) for c in item["choices"]]
        hits += max(range(len(scores)), key=scores.__getitem__) == item["label"]
    assert out["summary"]["wiki_cloze"]["acc"] == pytest.approx(hits / len(items))
