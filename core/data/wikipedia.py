"""Real English text for calibration and held-out perplexity, from a package the project installs.

The ``gensim`` wheel carries, as test data, an extract of the English Wikipedia (about 105 articles,
480k words, ≈ 720k SmolLM2 tokens; CC BY-SA 4.0, like all Wikipedia text). :func:`split_articles`
splits it *by article* into a calibration part and a held-out part with a fixed seed, so a run is never
evaluated on text it was calibrated on; :func:`prepare` writes both once as ``.txt`` files (one article
per blank-line separated block, the form ``core.data.texts`` reads).
"""

from __future__ import annotations

import importlib.util
import random
import re
from pathlib import Path

SOURCE = "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2"
LICENCE = "CC BY-SA 4.0 (Wikipedia), shipped in the gensim wheel's test data"
EVAL_FRACTION = 0.3  # of the articles, held out for perplexity
MIN_CHARS = 500  # shorter pages are stubs and lists


def source_path() -> Path | None:
    """The compressed Wikipedia extract inside the installed gensim package, or None without gensim."""
    spec = importlib.util.find_spec("gensim")
    if spec is None or spec.origin is None:
        return None
    path = Path(spec.origin).parent / SOURCE
    return path if path.is_file() else None


def read_articles(path: Path) -> list[tuple[str, str]]:
    """(title, plain text) of the extract's articles: redirects and stubs under :data:`MIN_CHARS` left out."""
    import bz2

    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    docs = [
        (title, filter_wiki(text))
        for title, text, _ in extract_pages(bz2.BZ2File(path), filter_namespaces=("0",))
        if not text.lower().startswith("#redirect")
    ]
    return [(title, re.sub(r"\n{3,}", "\n\n", text).strip()) for title, text in docs if len(text) > MIN_CHARS]


def split_articles(
    docs: list[tuple[str, str]], eval_fraction: float = EVAL_FRACTION, seed: int = 0
) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """(calibration, held-out): whole articles, shuffled with ``seed``, disjoint; ``eval_fraction`` of
    them (rounded) held out."""
    docs = list(docs)
    random.Random(seed).shuffle(docs)
    n_eval = round(len(docs) * eval_fraction)
    return docs[n_eval:], docs[:n_eval]


def as_text(docs: list[tuple[str, str]]) -> str:
    """One article per blank-line separated block (its own blank lines collapsed, so a reader of
    ``.txt`` files sees whole articles)."""
    return "\n\n".join(re.sub(r"\n\s*\n", "\n", text) for _, text in docs)


def prepare(
    calibration: Path, heldout: Path, source: Path | None = None, seed: int = 0, eval_fraction: float = EVAL_FRACTION
) -> tuple[Path, Path]:
    """Write the two parts once (each file written whole, then renamed); ``RuntimeError`` with one
    sentence when gensim is not installed."""
    calibration, heldout = Path(calibration), Path(heldout)
    if calibration.is_file() and heldout.is_file():
        return calibration, heldout
    source = source or source_path()
    if source is None:
        raise RuntimeError(
            "gensim is not installed, so the Wikipedia text is not offered: run `make run`, or "
            "`pip install gensim==4.4.0` and start again"
        )
    calib_docs, held_docs = split_articles(read_articles(source), eval_fraction, seed)
    for path, docs in ((calibration, calib_docs), (heldout, held_docs)):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(as_text(docs), encoding="utf-8")
        tmp.replace(path)
    return calibration, heldout
