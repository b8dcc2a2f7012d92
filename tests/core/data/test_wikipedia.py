"""The bundled real text (``core.data.wikipedia``): split by article into calibration and held-out
parts that never share an article, written once in the form the ``.txt`` reader takes."""

from __future__ import annotations

import pytest

from core.data import wikipedia
from core.data.texts import read_records

ARTICLES = [(f"Title {i}", f"Article {i} first paragraph.\n\nArticle {i} second paragraph.") for i in range(20)]


def test_split_by_article_disjoint_seeded():
    calib, held = wikipedia.split_articles(ARTICLES, 0.3, seed=0)
    assert len(held) == 6 and len(calib) == 14
    assert {t for t, _ in calib}.isdisjoint({t for t, _ in held})
    assert sorted(calib + held) == sorted(ARTICLES)
    assert wikipedia.split_articles(ARTICLES, 0.3, seed=0) == (calib, held)
    assert wikipedia.split_articles(ARTICLES, 0.3, seed=1) != (calib, held)


def test_prepared_once_one_article_per_document(tmp_path, monkeypatch):
    read = []
    monkeypatch.setattr(wikipedia, "read_articles", lambda path: read.append(path) or ARTICLES)
    calib, held = wikipedia.prepare(tmp_path / "c.txt", tmp_path / "h.txt", source=tmp_path / "dump.bz2")
    docs = read_records(held, "text")
    assert len(docs) == 6 and all(d.startswith("Article ") and "second paragraph" in d for d in docs)
    assert len(read_records(calib, "text")) == 14
    assert wikipedia.prepare(calib, held, source=tmp_path / "dump.bz2") == (calib, held) and len(read) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c.txt", "h.txt"]


def test_without_gensim_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(wikipedia, "source_path", lambda: None)
    with pytest.raises(RuntimeError, match=r"^gensim is not installed, .*pip install gensim==4\.4\.0"):
        wikipedia.prepare(tmp_path / "c.txt", tmp_path / "h.txt")
    assert list(tmp_path.iterdir()) == []


def test_the_real_extract_is_over_200_kb_of_english():
    if wikipedia.source_path() is None:
        pytest.skip("gensim is not installed (make run and make test install it)")
    docs = wikipedia.read_articles(wikipedia.source_path())
    calib, held = wikipedia.split_articles(docs)
    assert len(docs) > 100 and len(wikipedia.as_text(held)) > 200_000 and len(wikipedia.as_text(calib)) > 200_000
