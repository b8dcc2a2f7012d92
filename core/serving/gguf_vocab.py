"""A checkpoint's tokenizer as GGUF vocabulary fields, so llama.cpp needs nothing beside the file.

llama.cpp re-implements each tokenizer it supports and picks the pre-tokenizer (how text is split
before the merges) by name. This module reads ``tokenizer.json`` and supports two kinds:

- byte-level BPE (GPT-2 style: SmolLM2, LLaMA 3, Qwen2) whose pre-tokenizer is one llama.cpp
  implements, recognised from its definition, not from the model's name; written as llama.cpp's
  ``gpt2`` tokenizer with its merges;
- SentencePiece-style BPE (``byte_fallback``, "▁" for spaces: LLaMA 2, Mistral 7B) written as
  llama.cpp's ``llama`` tokenizer, which merges the adjacent pair whose joined token scores highest:
  a token's score is minus the rank of the first merge that makes it, so the pair that merges first
  in transformers merges first in llama.cpp; ``<0xNN>`` tokens are the byte fallback.

Anything else is refused in one sentence before a file is written.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

# llama.cpp's token types (llama_token_type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
_BYTE_TOKEN = re.compile(r"<0x[0-9A-Fa-f]{2}>")


class VocabError(ValueError):
    """The tokenizer cannot be written in a form llama.cpp reads (the message says why)."""


@dataclass
class Vocab:
    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    types: list[int]
    merges: list[str]
    scores: list[float] | None = None  # SentencePiece-style: a merged token's priority (higher first)
    add_space_prefix: bool | None = None  # SentencePiece-style: "▁" before the text
    special: dict[str, int] = field(default_factory=dict)  # bos / eos / unk / pad → id
    add_bos: bool = False
    add_eos: bool = False
    chat_template: str | None = None


def _split_regex(step: dict) -> str | None:
    pattern = step.get("pattern") or {}
    return pattern.get("Regex") or pattern.get("String")


def _pre_name(pre: dict | None) -> str:
    """llama.cpp's name for the pre-tokenizer defined by ``pre`` (tokenizer.json's ``pre_tokenizer``)."""
    steps = (pre or {}).get("pretokenizers", [pre] if pre else [])
    kinds = [s.get("type") for s in steps]
    byte_level = [s for s in steps if s.get("type") == "ByteLevel"]
    if not byte_level:
        raise VocabError(f"it is not byte-level BPE (pre-tokenizer steps {kinds})")
    if kinds == ["ByteLevel"] and byte_level[0].get("use_regex", True):
        return "gpt-2"
    if kinds == ["Digits", "ByteLevel"] and steps[0].get("individual_digits") and byte_level[0].get("use_regex", True):
        return "smollm"  # each digit alone, then GPT-2's split
    if kinds == ["Split", "ByteLevel"] and not byte_level[0].get("use_regex", True):
        regex = _split_regex(steps[0]) or ""
        if "\\p{N}{1,3}" in regex:
            return "llama-bpe"  # LLaMA 3: numbers in runs of up to three digits
        if "|\\p{N}|" in regex:
            return "qwen2"  # Qwen2: one digit per piece
    raise VocabError(
        f"its pre-tokenizer ({kinds}) is not one of those llama.cpp implements that this export recognises "
        "(GPT-2's, SmolLM's, LLaMA 3's, Qwen2's)"
    )


def _adds(tokenizer, token_id: int | None, first: bool) -> bool:
    if token_id is None:
        return False
    ids = tokenizer("a")["input_ids"]
    return bool(ids) and ids[0 if first else -1] == token_id


def _space_prefix(spec: dict) -> bool:
    """Whether a SentencePiece-style tokenizer puts "▁" before the text (LLaMA 2's normalizer prepends
    it, Gemma's does not; a Metaspace pre-tokenizer does with prepend_scheme first or always); other layouts
    are refused."""
    norm, pre = spec.get("normalizer") or {}, spec.get("pre_tokenizer") or {}
    steps = norm.get("normalizers", [norm] if norm else [])
    kinds = [x.get("type") for x in steps]
    spaces_gone = kinds[-1:] == ["Replace"] and _split_regex(steps[-1]) == " " and steps[-1].get("content") == "▁"
    if pre.get("type") == "Split" and _split_regex(pre) == " " and spaces_gone:
        pre = {}  # Gemma's split at spaces, which the normalizer has already replaced by "▁": it splits nothing
    if not pre and kinds in (["Prepend", "Replace"], ["Replace"]):
        return kinds[0] == "Prepend" and steps[0].get("prepend") == "▁"
    if not norm and pre.get("type") == "Metaspace" and pre.get("replacement", "▁") == "▁":
        return pre.get("prepend_scheme", "always") in ("first", "always")
    raise VocabError(f"its SentencePiece-style layout (normalizer {kinds}, pre-tokenizer {pre.get('type')}) is not "
                     "one this export states")  # fmt: skip


def _merge_scores(tokens: list[str], merges: list[str]) -> list[float]:
    """Minus the rank of the first merge that makes each token (0 for tokens no merge makes)."""
    rank: dict[str, int] = {}
    for r, merge in enumerate(merges):
        left, _, right = merge.partition(" ")
        rank.setdefault(left + right, r)
    return [-float(rank[t]) if t in rank else 0.0 for t in tokens]


def read_vocab(directory: str | Path, n_vocab: int) -> Vocab:
    """The vocabulary of the checkpoint in ``directory``, padded with unused tokens to ``n_vocab``
    (the embedding's rows, which llama.cpp requires to equal the token count)."""
    from transformers import AutoTokenizer

    path = Path(directory) / "tokenizer.json"
    if not path.is_file():
        raise VocabError(f"{path.parent} has no tokenizer.json (the GGUF's vocabulary is written from it)")
    try:
        spec = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise VocabError(f"cannot read {path}: {exc}") from None
    model = spec.get("model") or {}
    if model.get("type") != "BPE":
        raise VocabError(
            f"it is {model.get('type')}, and GGUF export writes BPE tokenizers (byte-level: SmolLM2, LLaMA 3, "
            "Qwen2; SentencePiece-style: LLaMA 2, Mistral)"
        )
    spm = bool(model.get("byte_fallback"))
    pre, space_prefix = ("default", _space_prefix(spec)) if spm else (_pre_name(spec.get("pre_tokenizer")), None)
    by_id: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in model["vocab"].items()}
    for added in spec.get("added_tokens", []):
        by_id[added["id"]] = (added["content"], CONTROL if added.get("special") else USER_DEFINED)
    if by_id and max(by_id) >= n_vocab:
        raise VocabError(f"it has token id {max(by_id)} but the embedding only {n_vocab} rows")
    tokens, types = [], []
    for i in range(n_vocab):
        text, kind = by_id.get(i, (f"[PAD{i}]", UNUSED))
        if spm and _BYTE_TOKEN.fullmatch(text):
            kind = BYTE
        elif spm and text == model.get("unk_token"):
            kind = UNKNOWN
        tokens.append(text)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    scores = _merge_scores(tokens, merges) if spm else None
    tok = AutoTokenizer.from_pretrained(directory)
    special = {
        name: getattr(tok, f"{name}_token_id")
        for name in ("bos", "eos", "unk", "pad")
        if getattr(tok, f"{name}_token_id", None) is not None
    }
    template = getattr(tok, "chat_template", None)
    return Vocab(
        model="llama" if spm else "gpt2",
        pre=pre,
        tokens=tokens,
        types=types,
        merges=[] if spm else merges,
        scores=scores,
        add_space_prefix=space_prefix,
        special=special,
        add_bos=_adds(tok, special.get("bos"), first=True),
        add_eos=_adds(tok, special.get("eos"), first=False),
        chat_template=template if isinstance(template, str) else None,
    )


def write_vocab(writer, vocab: Vocab) -> None:
    """Add ``vocab``'s fields to a ``gguf.GGUFWriter``."""
    writer.add_tokenizer_model(vocab.model)
    writer.add_tokenizer_pre(vocab.pre)
    writer.add_token_list(vocab.tokens)
    writer.add_token_types(vocab.types)
    if vocab.merges:
        writer.add_token_merges(vocab.merges)
    if vocab.scores is not None:
        writer.add_token_scores(vocab.scores)
    if vocab.add_space_prefix is not None:
        writer.add_add_space_prefix(vocab.add_space_prefix)
    for name, token_id in vocab.special.items():
        getattr(writer, f"add_{name}_token_id")(token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
