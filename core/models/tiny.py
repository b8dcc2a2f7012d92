"""Tiny random models, tokenizers and text for tests, demos and smoke runs (no downloads).

Each ``tiny_*`` function writes a loadable Hugging Face directory (config, safetensors, tokenizer) and
returns its path: a GQA decoder of every supported family (Llama, Mistral, Qwen2 with q/k/v biases,
Qwen3, Gemma 2 / 3, Phi-3, OPT), and a BERT classifier.
"""

from __future__ import annotations

import random
from pathlib import Path

import torch

_WORDS = (
    "the a model layer head neuron prune keep weight bias token text data mean least square error "
    "input output attention network small large fast slow train test run time value score linear "
    "matrix vector channel sample window batch reconstruct compress language word sentence good bad "
    "film movie story plot actor scene great boring fun dull bright dark river city music"
).split()


def tiny_corpus(n_docs: int = 40, words_per_doc: int = 120, seed: int = 0) -> list[str]:
    """Seeded pseudo-text: documents of sentences over a small vocabulary, with some structure."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n_docs):
        sentences, count = [], 0
        while count < words_per_doc:
            k = rng.randint(4, 12)
            start = rng.randrange(len(_WORDS))
            words = [_WORDS[(start + rng.choice((0, 1, 1, 2, 3)) * j) % len(_WORDS)] for j in range(k)]
            sentences.append(" ".join(words).capitalize() + ".")
            count += k
        docs.append(" ".join(sentences))
    return docs


def tiny_tokenizer(encoder: bool = False):
    """A word-level fast tokenizer over the tiny vocabulary (BERT-style specials if ``encoder``)."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors
    from transformers import PreTrainedTokenizerFast

    specials = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"] if encoder else ["<pad>", "<unk>", "<s>", "</s>"]
    vocab = {t: i for i, t in enumerate(specials + sorted(set(_WORDS)) + [".", ","])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=specials[1]))
    tok.normalizer = normalizers.Lowercase()
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Punctuation()])
    if encoder:
        tok.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", vocab["[CLS]"]), ("[SEP]", vocab["[SEP]"])],
        )
        return PreTrainedTokenizerFast(
            tokenizer_object=tok,
            pad_token="[PAD]",
            unk_token="[UNK]",
            cls_token="[CLS]",
            sep_token="[SEP]",
            mask_token="[MASK]",
        )
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def tiny_bpe_tokenizer(vocab_size: int = 320):
    """A byte-level BPE tokenizer (GPT-2's pre-tokenizer) trained on :func:`tiny_corpus`: the kind of
    tokenizer serving engines re-implement, for tests that hand a model to one (training is
    deterministic, so every call gives the same vocabulary)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<unk>", "<s>", "</s>"]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", unk_token="<unk>", bos_token="<s>", eos_token="</s>"
    )


def tiny_spm_tokenizer(vocab_size: int = 400):
    """A SentencePiece-style BPE tokenizer as LLaMA 2 and Mistral 7B ship it in ``tokenizer.json``
    ("▁" for spaces and before the text, ``<0xNN>`` byte-fallback tokens in the vocabulary, a
    beginning-of-sequence token added), trained on :func:`tiny_corpus` (deterministic)."""
    import json

    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<unk>", "<s>", "</s>"]
    byte_tokens = [f"<0x{i:02X}>" for i in range(256)]
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=True)
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=specials + byte_tokens)
    tok.train_from_iterator(tiny_corpus(), trainer=trainer)
    spec = json.loads(tok.to_str())  # the byte tokens stay in the vocabulary, not among the added tokens
    spec["added_tokens"] = [a for a in spec["added_tokens"] if a["content"] in specials]
    spec["pre_tokenizer"] = None
    tok = Tokenizer.from_str(json.dumps(spec))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.decoder = decoders.Sequence(
        [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0)]
    )
    tok.post_processor = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    return PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="<unk>", bos_token="<s>", eos_token="</s>")


def _save(model, tokenizer, path: str | Path) -> Path:
    path = Path(path)
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


# per-family settings of the tiny decoders: Gemma's sliding window (8) is shorter than the test
# sequences, so its sliding-window and full-attention layers really differ
_FAMILY_CONFIG = {
    "gemma2": dict(
        head_dim=8,
        query_pre_attn_scalar=8,
        sliding_window=8,
        attn_logit_softcapping=50.0,
        final_logit_softcapping=30.0,
        layer_types=["sliding_attention", "full_attention"],
    ),
    "gemma3": dict(
        head_dim=8, query_pre_attn_scalar=8, sliding_window=8, layer_types=["sliding_attention", "full_attention"]
    ),
    "qwen3": dict(head_dim=8),
    "phi3": dict(),
}


def tiny_decoder(path: str | Path, family: str = "llama", seed: int = 0, tokenizer: str = "words", **overrides) -> Path:
    """A random 2-layer decoder of ``family``: 8 query heads over 4 key/value heads (GQA; OPT: 8 heads),
    head_dim 8, FFN 48; ``tokenizer`` "words" (:func:`tiny_tokenizer`), "bpe" (:func:`tiny_bpe_tokenizer`) or
    "spm" (:func:`tiny_spm_tokenizer`)."""
    import transformers

    from core.models.liar_families import FAMILIES

    fam = FAMILIES[family]
    tok = {"bpe": tiny_bpe_tokenizer, "spm": tiny_spm_tokenizer}.get(tokenizer, tiny_tokenizer)()
    kw = dict(
        vocab_size=len(tok),
        hidden_size=64,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=8,
        num_key_value_heads=4,
        max_position_embeddings=256,
        pad_token_id=tok.pad_token_id,
        bos_token_id=tok.bos_token_id,
        eos_token_id=tok.eos_token_id,
        tie_word_embeddings=False,
    )
    if family == "opt":  # multi-head attention, FFN width under its own key, no down-projected embeddings
        del kw["num_key_value_heads"]
        kw.update(ffn_dim=kw.pop("intermediate_size"), word_embed_proj_dim=64)
    kw.update(_FAMILY_CONFIG.get(family, {}))
    kw.update(overrides)
    config = getattr(transformers, fam.config_class)(**kw)
    torch.manual_seed(seed)
    model = getattr(transformers, fam.model_classes["AutoModelForCausalLM"])(config)
    _perturb(model, seed)
    return _save(model, tok, path)


def tiny_bert(path: str | Path, task: str = "classification", seed: int = 0, **overrides) -> Path:
    """A random 2-layer BERT (4 heads of 8, FFN 48) with a sequence-classification or QA head."""
    from transformers import BertConfig, BertForQuestionAnswering, BertForSequenceClassification, BertModel

    tok = tiny_tokenizer(encoder=True)
    kw = dict(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=128,
        pad_token_id=tok.pad_token_id,
        num_labels=2,
    )
    kw.update(overrides)
    cls = {"classification": BertForSequenceClassification, "qa": BertForQuestionAnswering, "base": BertModel}[task]
    torch.manual_seed(seed)
    model = cls(BertConfig(**kw))
    _perturb(model, seed)
    return _save(model, tok, path)


@torch.no_grad()
def _perturb(model, seed: int) -> None:
    """Give every bias and norm weight random values so tests exercise all of them."""
    gen = torch.Generator().manual_seed(seed + 1)
    for name, p in model.named_parameters():
        if name.endswith("bias") or "norm" in name.lower():
            p.add_(0.1 * torch.randn(p.shape, generator=gen))
