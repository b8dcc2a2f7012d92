"""A checkpoint's tokenizer as GGUF vocabulary fields, so llama.cpp needs nothing beside the file.

llama.cpp re-implements each tokenizer it supports and picks the pre-tokenizer (how text is split
before the merges) by name. This module reads ``tokenizer.json`` and supports byte-level BPE
tokenizers (GPT-2 style, as SmolLM2, LLaMA 3 and Qwen2 use) whose pre-tokenizer is one llama.cpp
implements; it recognises the pre-tokenizer from its definition, not from the model's name. Anything
else is refused in one sentence before a file is written.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

# llama.cpp's token types (llama_token_type)
NORMAL, CONTROL, USER_DEFINED, UNUSED = 1, 3, 4, 5


class VocabError(ValueError):
    """The tokenizer cannot be written in a form llama.cpp reads (the message says why)."""


@dataclass
class Vocab:
    model: str  # tokenizer.ggml.model
    pre: str  # tokenizer.ggml.pre
    tokens: list[str]
    types: list[int]
    merges: list[str]
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
    if model.get("type") != "BPE" or model.get("byte_fallback"):
        kind = "SentencePiece-style BPE" if model.get("byte_fallback") else model.get("type")
        raise VocabError(
            f"it is {kind}, and GGUF export writes byte-level BPE tokenizers (those of SmolLM2, LLaMA 3, Qwen2)"
        )
    pre = _pre_name(spec.get("pre_tokenizer"))
    by_id: dict[int, tuple[str, int]] = {i: (t, NORMAL) for t, i in model["vocab"].items()}
    for added in spec.get("added_tokens", []):
        by_id[added["id"]] = (added["content"], CONTROL if added.get("special") else USER_DEFINED)
    if by_id and max(by_id) >= n_vocab:
        raise VocabError(f"it has token id {max(by_id)} but the embedding only {n_vocab} rows")
    tokens, types = [], []
    for i in range(n_vocab):
        text, kind = by_id.get(i, (f"[PAD{i}]", UNUSED))
        tokens.append(text)
        types.append(kind)
    merges = [m if isinstance(m, str) else " ".join(m) for m in model.get("merges", [])]
    tok = AutoTokenizer.from_pretrained(directory)
    special = {
        name: getattr(tok, f"{name}_token_id")
        for name in ("bos", "eos", "unk", "pad")
        if getattr(tok, f"{name}_token_id", None) is not None
    }
    template = getattr(tok, "chat_template", None)
    return Vocab(
        model="gpt2",
        pre=pre,
        tokens=tokens,
        types=types,
        merges=merges,
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
    writer.add_token_merges(vocab.merges)
    for name, token_id in vocab.special.items():
        getattr(writer, f"add_{name}_token_id")(token_id)
    writer.add_add_bos_token(vocab.add_bos)
    writer.add_add_eos_token(vocab.add_eos)
    if vocab.chat_template:
        writer.add_chat_template(vocab.chat_template)
