"""Encoder task metrics against hand-computed values; classifier / QA evaluators on tiny random BERTs."""

import json
import math

import pytest
import torch

from core.evaluation.encoder import evaluate_classifier, evaluate_qa
from core.evaluation.metrics import (
    accuracy,
    average_ranks,
    exact_match,
    normalize_answer,
    pearson,
    spearman,
    squad_metrics,
    squad_scores,
    token_f1,
)
from core.evaluation.task_data import read_classification_file, read_qa_file
from core.models.loading import load_model
from core.models.tiny import tiny_bert

# --- metrics ------------------------------------------------------------------------------------


def test_average_ranks_and_spearman_with_ties_by_hand():
    x, y = [1, 2, 2, 3, 5], [2, 1, 3, 3, 4]
    assert average_ranks(x) == [1, 2.5, 2.5, 4, 5]
    assert average_ranks(y) == [2, 1, 3.5, 3.5, 5]
    # rank deviations from the mean rank 3: (-2, -.5, -.5, 1, 2) and (-1, -2, .5, .5, 2)
    # covariance sum 2 + 1 - .25 + .5 + 4 = 7.25; both sums of squares 9.5
    assert spearman(x, y) == pytest.approx(7.25 / 9.5, abs=1e-12)
    assert average_ranks([3.0, 3.0, 3.0]) == [2, 2, 2]
    assert spearman([1, 2, 3, 4], [10, 20, 30, 1000]) == pytest.approx(1.0)  # monotone, not linear
    assert spearman([1, 2, 3, 4], [4, 3, 2, 1]) == pytest.approx(-1.0)


def test_pearson_by_hand_and_undefined_cases():
    # x deviations (-1, 0, 1), y = (1, 2, 5) deviations (-5/3, -2/3, 7/3): sxy 4, sxx 2, syy 78/9
    assert pearson([1, 2, 3], [1, 2, 5]) == pytest.approx(4 / math.sqrt(2 * 78 / 9), abs=1e-12)
    assert math.isnan(pearson([1, 1, 1], [1, 2, 3]))
    with pytest.raises(ValueError, match="at least two points"):
        pearson([1], [1])
    with pytest.raises(ValueError, match="3 values against 2"):
        spearman([1, 2, 3], [1, 2])


def test_accuracy():
    assert accuracy([1, 0, 1, 1], [1, 1, 1, 0]) == 0.5
    with pytest.raises(ValueError, match="2 predictions for 3 labels"):
        accuracy([1, 0], [1, 0, 1])


def test_squad_normalisation_em_and_f1_by_hand():
    assert normalize_answer("The  Cat, (a) dog!") == "cat dog"
    assert normalize_answer("an apple's theory") == "apples theory"  # 'the' inside a word stays
    assert exact_match("An Apple.", "apple") == 1.0
    assert exact_match("apples", "apple") == 0.0
    # pred tokens {cat, sat}, gold {cat, sat, down}: precision 1, recall 2/3 → F1 0.8
    assert token_f1("the cat sat", "a cat sat down") == pytest.approx(0.8)
    # pred (big, big, dog) vs gold (big, dog, dog): overlap min counts = big 1 + dog 1 = 2 → P = R = 2/3
    assert token_f1("big big dog", "big dog dog") == pytest.approx(2 / 3)
    assert token_f1("nothing shared", "else") == 0.0
    # best over gold answers
    assert squad_scores("Paris", ["the city of Paris", "Paris"]) == (1.0, 1.0)
    em, f1 = squad_scores("city of Paris", ["the city of Paris France", "London"])
    assert em == 0.0 and f1 == pytest.approx(2 * 1 * 0.75 / 1.75)  # 3 of 3 pred, 3 of 4 gold tokens


def test_squad_v2_no_answer_handling_by_hand():
    assert squad_scores("", []) == (1.0, 1.0)
    assert squad_scores("something", []) == (0.0, 0.0)
    assert squad_scores("", ["an answer"]) == (0.0, 0.0)
    assert squad_scores("", ["the", "a"]) == (1.0, 1.0)  # answers that normalise to nothing count as none
    records = [
        {"id": "1", "answers": ["blue sky"]},
        {"id": "2", "answers": ["green"]},
        {"id": "3", "answers": []},
        {"id": "4", "answers": []},
    ]
    preds = {"1": "the blue sky", "2": "green grass", "3": "", "4": "red"}
    m = squad_metrics(preds, records)
    # EM: 1, 0, 1, 0 → 0.5; F1: 1, 2/3 (P 1/2, R 1), 1, 0 → (8/3)/4
    assert m["exact_match"] == pytest.approx(0.5) and m["f1"] == pytest.approx((2 + 2 / 3) / 4)
    assert m["has_answer_n"] == 2 and m["has_answer_exact_match"] == pytest.approx(0.5)
    assert m["has_answer_f1"] == pytest.approx((1 + 2 / 3) / 2)
    assert m["no_answer_n"] == 2 and m["no_answer_exact_match"] == pytest.approx(0.5)
    assert "has_answer_n" not in squad_metrics({"1": "blue sky"}, records[:1])
    with pytest.raises(ValueError, match="no prediction for question '2'"):
        squad_metrics({"1": "x"}, records[:2])


# --- local files ----------------------------------------------------------------------------------


def test_read_classification_files(tmp_path):
    csv_file = tmp_path / "sst.csv"
    csv_file.write_text('sentence,label\n"good, fun film",1\nbad film,0\n')
    assert read_classification_file(csv_file, text_field="sentence") == [
        {"text": "good, fun film", "label": 1},
        {"text": "bad film", "label": 0},
    ]
    sts = tmp_path / "sts.jsonl"
    sts.write_text('{"s1": "a", "s2": "b", "score": 3.5}\n\n{"s1": "c", "s2": "d", "score": "1"}\n')
    assert read_classification_file(sts, "s1", "s2", "score") == [
        {"text": "a", "text_pair": "b", "label": 3.5},
        {"text": "c", "text_pair": "d", "label": 1},
    ]
    js = tmp_path / "named.json"
    js.write_text(json.dumps({"data": [{"text": "x", "label": "positive"}]}))
    assert read_classification_file(js) == [{"text": "x", "label": "positive"}]
    gap = tmp_path / "gap.jsonl"
    gap.write_text('{"s1": "a", "s2": "b", "score": 3.5}\n{"s1": "c", "score": 1}\n')
    with pytest.raises(ValueError, match=r"gap.jsonl: record 2 has no field 's2'"):
        read_classification_file(gap, "s1", "s2", "score")
    with pytest.raises(FileNotFoundError, match="missing.csv"):
        read_classification_file(tmp_path / "missing.csv")
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "a", "label": 1}\n{oops\n')
    with pytest.raises(ValueError, match=r"bad.jsonl:2: not valid JSON"):
        read_classification_file(bad)
    with pytest.raises(ValueError, match="unsupported file type '.txt'"):
        (tmp_path / "x.txt").write_text("a")
        read_classification_file(tmp_path / "x.txt")


def test_read_qa_files(tmp_path):
    official = tmp_path / "dev-v2.0.json"
    official.write_text(
        json.dumps(
            {
                "version": "v2.0",
                "data": [
                    {
                        "title": "T",
                        "paragraphs": [
                            {
                                "context": "The river runs through the city.",
                                "qas": [
                                    {
                                        "id": "q1",
                                        "question": "What runs?",
                                        "answers": [{"text": "river", "answer_start": 4}],
                                    },
                                    {"id": "q2", "question": "Who?", "answers": [], "is_impossible": True},
                                ],
                            }
                        ],
                    }
                ],
            }
        )
    )
    recs = read_qa_file(official)
    assert [r["id"] for r in recs] == ["q1", "q2"]
    assert recs[0]["answers"] == ["river"] and recs[1]["answers"] == []
    assert recs[0]["context"] == "The river runs through the city."
    hf = tmp_path / "hf.jsonl"
    hf.write_text(
        json.dumps({"q": "what?", "c": "ctx", "answers": {"text": ["ctx"], "answer_start": [0]}}) + "\n"
        + json.dumps({"q": "why?", "c": "ctx"}) + "\n"
    )  # fmt: skip
    with pytest.raises(ValueError, match=r"hf.jsonl: record 2 has no field 'answers'"):
        read_qa_file(hf, question_field="q", context_field="c")
    dup = tmp_path / "dup.jsonl"
    dup.write_text('{"id": "a", "question": "q", "context": "c", "answers": []}\n' * 2)
    with pytest.raises(ValueError, match="question id 'a' occurs more than once"):
        read_qa_file(dup)


# --- evaluators on tiny random BERTs --------------------------------------------------------------

SENTENCES = [
    ("good film great fun", 1),
    ("bad movie boring plot", 0),
    ("the actor is dull", 0),
    ("bright music and a great story", 1),
    ("slow and dark", 0),
    ("fun", 1),
    ("the city river film scene is good and the music is bright", 1),
]


def _logits_one_by_one(model, tok, texts, pairs=None):
    """Logits of unpadded single-example forwards (checks that batching/padding changes nothing)."""
    out = []
    with torch.no_grad():
        for i, t in enumerate(texts):
            enc = tok(t, pairs[i] if pairs else None, return_tensors="pt")
            out.append(model(**enc).logits[0])
    return out


def test_classifier_accuracy_matches_single_example_forwards(bert_dir):
    model, tok, _ = load_model(str(bert_dir), "float32", "cpu")
    records = [{"text": t, "label": y} for t, y in SENTENCES]
    result = evaluate_classifier(model, tok, records, batch_size=3, max_length=32, return_predictions=True)
    expected = [int(lg.argmax()) for lg in _logits_one_by_one(model, tok, [t for t, _ in SENTENCES])]
    assert result["predictions"] == expected
    assert result["accuracy"] == pytest.approx(sum(p == y for p, (_, y) in zip(expected, SENTENCES)) / 7)
    assert 0.0 <= result["accuracy"] <= 1.0 and result["n"] == 7
    # label names go through config.label2id
    named = [{"text": t, "label": model.config.id2label[y]} for t, y in SENTENCES]
    assert evaluate_classifier(model, tok, named)["accuracy"] == result["accuracy"]
    with pytest.raises(ValueError, match=r"record 1: the label is not a class index"):
        evaluate_classifier(model, tok, [{"text": "x", "label": "meh"}])
    with pytest.raises(ValueError, match="outside the model's 2 classes"):
        evaluate_classifier(model, tok, [{"text": "x", "label": 5}])


def test_regressor_reports_spearman_of_its_outputs(tmp_path):
    model, tok, _ = load_model(str(tiny_bert(tmp_path / "sts", "classification", num_labels=1)), "float32", "cpu")
    a = [t for t, _ in SENTENCES]
    b = list(reversed(a))
    scores = [0.5, 4.0, 2.5, 2.5, 1.0, 5.0, 3.0]
    records = [{"text": x, "text_pair": y, "label": s} for x, y, s in zip(a, b, scores)]
    result = evaluate_classifier(model, tok, records, batch_size=4, return_predictions=True)
    single = [float(lg[0]) for lg in _logits_one_by_one(model, tok, a, b)]
    assert result["predictions"] == pytest.approx(single, abs=1e-5)
    assert result["spearman"] == spearman(result["predictions"], scores)
    assert result["pearson"] == pearson(result["predictions"], scores)
    assert -1.0 <= result["spearman"] <= 1.0
    with pytest.raises(ValueError, match="either every record or none has a 'text_pair'"):
        evaluate_classifier(model, tok, [records[0], {"text": "x", "label": 1.0}])


QA = [
    {"id": "a", "question": "what model", "context": "The small model is a fast network.", "answers": ["small model"]},
    {
        "id": "b",
        "question": "which city",
        "context": "The city river is dark and the music is great fun.",
        "answers": [],
    },
    {
        "id": "c",
        "question": "what is the plot",
        "context": " ".join(["the story of a film and a good actor in a bright scene ."] * 6),
        "answers": ["good actor", "the actor"],
    },
]


def test_qa_decoding_equals_brute_force_search(bert_qa_dir):
    model, tok, _ = load_model(str(bert_qa_dir), "float32", "cpu")
    rec = QA[0]
    result = evaluate_qa(
        model, tok, [rec], max_length=64, doc_stride=16, max_answer_length=4, n_best=100, return_predictions=True
    )
    enc = tok(rec["question"], rec["context"], return_offsets_mapping=True)
    with torch.no_grad():
        out = model(**{k: torch.tensor([v]) for k, v in enc.items() if k != "offset_mapping"})
    ctx = [i for i, s in enumerate(enc.sequence_ids()) if s == 1]
    s_log, e_log = out.start_logits[0], out.end_logits[0]
    best = max(((s, e) for s in ctx for e in ctx if s <= e < s + 4), key=lambda p: float(s_log[p[0]] + e_log[p[1]]))
    off = enc["offset_mapping"]
    assert result["predictions"]["a"] == rec["context"][off[best[0]][0] : off[best[1]][1]]
    assert result["version_2"] is False and 0 <= result["f1"] <= 1 and 0 <= result["exact_match"] <= 1


def test_qa_long_contexts_and_no_answer_threshold(bert_qa_dir):
    model, tok, _ = load_model(str(bert_qa_dir), "float32", "cpu")
    kw = dict(batch_size=2, max_length=24, doc_stride=8, max_answer_length=5)  # "c" spans several windows
    res = evaluate_qa(model, tok, QA, null_score_diff_threshold=1e9, return_predictions=True, **kw)
    assert res["version_2"] is True and res["n"] == 3 and res["has_answer_n"] == 2 and res["no_answer_n"] == 1
    for rec in QA:
        pred = res["predictions"][rec["id"]]
        assert pred and pred in rec["context"] and len(pred.split()) <= 5
    assert res["no_answer_exact_match"] == 0.0  # a huge threshold never abstains
    abstain = evaluate_qa(model, tok, QA, null_score_diff_threshold=-1e9, **kw)
    assert abstain["no_answer_exact_match"] == 1.0 and abstain["has_answer_exact_match"] == 0.0
    assert abstain["exact_match"] == pytest.approx(1 / 3)
    # scoring the model against its own answers is perfect: spans are cut from the context exactly
    own = [{**r, "answers": [res["predictions"][r["id"]]]} for r in QA]
    again = evaluate_qa(model, tok, own, null_score_diff_threshold=1e9, **kw)
    assert again["exact_match"] == 1.0 and again["f1"] == 1.0


def test_qa_input_errors(bert_qa_dir):
    model, tok, _ = load_model(str(bert_qa_dir), "float32", "cpu")
    with pytest.raises(ValueError, match="QA record 1 has no field 'answers'"):
        evaluate_qa(model, tok, [{"id": "1", "question": "q", "context": "c"}])

    class Slow:
        is_fast = False

    with pytest.raises(ValueError, match=r"doc_stride \(128\) must be below half of max_length \(64\)"):
        evaluate_qa(model, tok, QA, max_length=64)
    with pytest.raises(ValueError, match="needs a fast tokenizer"):
        evaluate_qa(model, Slow(), QA)
