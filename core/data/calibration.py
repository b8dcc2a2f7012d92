"""Calibration data: named sets, local files or strings → seeded token windows.

Decoders get ``n`` windows of exactly ``L`` tokens drawn at seeded random offsets from the
concatenated documents (as SparseGPT / FLAP do). Held-aside windows (for the reconstruction report)
come from the last part of the token stream, which the fit windows never touch. Encoders get one
sample per text (or text pair), truncated and padded to ``L`` with an attention mask.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from core.data.texts import load_named, read_records, read_rows
from core.spec.recipe import NAMED_DATASETS, CalibrationConfig


@dataclass
class CalibrationBatch:
    """Token ids ``(n, L)`` and attention mask ``(n, L)`` (1 = real token)."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    token_type_ids: torch.Tensor | None = None
    labels: torch.Tensor | None = None  # (n,) task labels of encoder samples, when the source has them

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def model_inputs(self, kind: str, device) -> dict[str, torch.Tensor | bool]:
        """Keyword arguments for the model's base forward (no key/value cache for decoders)."""
        inputs = {"input_ids": self.input_ids.to(device), "attention_mask": self.attention_mask.to(device)}
        if self.token_type_ids is not None:
            inputs["token_type_ids"] = self.token_type_ids.to(device)
        if kind == "decoder":
            inputs["use_cache"] = False
        return inputs

    def token_mask(self, kind: str, device) -> torch.Tensor | None:
        """Real (non-padding) tokens for statistics; None for decoders, whose windows have no padding."""
        return self.attention_mask.to(device).bool() if kind == "encoder" else None

    @staticmethod
    def concat(batches: list[CalibrationBatch]) -> CalibrationBatch:
        """One batch of all samples; batches trimmed to different widths (:meth:`slice`) are padded back
        to the widest on the right (masked out, so any id will do)."""
        width = max(b.input_ids.shape[1] for b in batches)

        def cat(xs: list[torch.Tensor | None]) -> torch.Tensor | None:
            if xs[0] is None:
                return None
            return torch.cat([F.pad(x, (0, width - x.shape[1])) if x.dim() == 2 else x for x in xs])

        return CalibrationBatch(
            cat([b.input_ids for b in batches]),
            cat([b.attention_mask for b in batches]),
            cat([b.token_type_ids for b in batches]),
            cat([b.labels for b in batches]),
        )

    def slice(self, start: int, stop: int) -> CalibrationBatch:
        """Samples ``start:stop``, without the trailing padding columns none of them uses: encoder samples
        are padded to ``max_seq_length`` (MiniLM's review snippets: 43% real tokens), and a batch only
        needs its longest sample's length. Trailing padding is masked out of every real token's
        attention and sits after every real position, so the real tokens' computations do not change;
        a batch padded on the left ends in real tokens and keeps its width."""
        mask = self.attention_mask[start:stop]
        used = mask.any(0).nonzero()
        width = int(used[-1]) + 1 if len(used) else min(1, mask.shape[1])
        tt = None if self.token_type_ids is None else self.token_type_ids[start:stop, :width]
        labels = None if self.labels is None else self.labels[start:stop]
        return CalibrationBatch(self.input_ids[start:stop, :width], mask[:, :width], tt, labels)


def load_labels(cfg: CalibrationConfig) -> torch.Tensor | None:
    """Numeric task labels (``calibration.label_field``) aligned with :func:`load_texts`, or None."""
    if cfg.label_field is None:
        return None
    path = Path(cfg.dataset).expanduser()
    values = []
    for i, rec in enumerate(read_rows(path)[1], 1):
        if cfg.label_field not in rec:
            raise ValueError(f"{path}: record {i} has no label field {cfg.label_field!r}")
        v = rec[cfg.label_field]
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"{path}: record {i}: the label is not a number (a class index or a regression target)")
        values.append(v)
    floats = any(isinstance(v, float) and not float(v).is_integer() for v in values)
    return torch.tensor(values, dtype=torch.float32 if floats else torch.long)


def load_texts(cfg: CalibrationConfig) -> list[str | tuple[str, str]]:
    if cfg.texts is not None:
        texts = [t for t in cfg.texts if t.strip()]
    elif cfg.dataset in NAMED_DATASETS:
        texts = load_named(cfg.dataset)
    else:
        texts = read_records(cfg.dataset, cfg.text_field)
    if not texts:
        raise ValueError("the calibration source holds no text")
    return texts


def _join(t: str | tuple[str, str]) -> str:
    return t if isinstance(t, str) else "\n".join(t)


def decoder_windows(texts, tokenizer, cfg: CalibrationConfig) -> tuple[CalibrationBatch, CalibrationBatch]:
    """Seeded ``(n, L)`` fit windows and ``(holdout, L)`` held-aside windows of one token stream."""
    n, hold, length = cfg.num_calibration_samples, cfg.holdout_samples, cfg.max_seq_length
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(texts), generator=gen).tolist()
    sep = tokenizer.eos_token or "\n\n"
    ids: list[int] = []
    budget = 4 * (n + hold) * length + length  # enough tokens for well-spread windows
    for i in order:
        ids.extend(tokenizer(_join(texts[i]) + sep, add_special_tokens=False)["input_ids"])
        if len(ids) >= budget:
            break
    stream = torch.tensor(ids, dtype=torch.long)
    need = length * (2 if hold else 1)
    if len(stream) < need:
        raise ValueError(
            f"the calibration text has {len(stream)} tokens, fewer than the {need} needed for windows of "
            f"max_seq_length={length}{' plus a held-aside window' if hold else ''}; give more text or "
            "a shorter max_seq_length"
        )
    hold_start = len(stream) - max(length, len(stream) * hold // (n + hold)) if hold else len(stream)
    hold_start = max(hold_start, length)

    def windows(lo: int, hi: int, count: int) -> torch.Tensor:
        starts = torch.randint(lo, hi - length + 1, (count,), generator=gen)
        return torch.stack([stream[s : s + length] for s in starts.tolist()])

    fit = windows(0, hold_start, n)
    held = windows(hold_start, len(stream), hold) if hold else fit[:0]
    return (
        CalibrationBatch(fit, torch.ones_like(fit)),
        CalibrationBatch(held, torch.ones_like(held)),
    )


def encoder_samples(
    texts, tokenizer, cfg: CalibrationConfig, labels: torch.Tensor | None = None
) -> tuple[CalibrationBatch, CalibrationBatch]:
    """One padded sample per text or text pair (with its label, if given); held-aside samples are
    disjoint from fit samples."""
    gen = torch.Generator().manual_seed(cfg.seed)
    order = torch.randperm(len(texts), generator=gen).tolist()
    n, hold = cfg.num_calibration_samples, cfg.holdout_samples
    if len(order) < 2 and hold:
        hold = 0
    hold_idx = order[:hold] if len(order) > hold else []
    fit_pool = order[len(hold_idx) :]
    fit_idx = [fit_pool[i % len(fit_pool)] for i in range(min(n, len(fit_pool)))]

    def encode(idx: list[int]) -> CalibrationBatch:
        chosen = [texts[i] for i in idx]
        if chosen and isinstance(chosen[0], tuple):
            enc = tokenizer(
                [a for a, _ in chosen],
                [b for _, b in chosen],
                truncation=True,
                max_length=cfg.max_seq_length,
                padding="max_length",
                return_tensors="pt",
            )
        else:
            enc = tokenizer(
                [_join(t) for t in chosen] or [""],
                truncation=True,
                max_length=cfg.max_seq_length,
                padding="max_length",
                return_tensors="pt",
            )
            if not chosen:
                enc = {k: v[:0] for k, v in enc.items()}
        chosen_labels = None if labels is None else labels[torch.tensor(idx, dtype=torch.long)]
        return CalibrationBatch(enc["input_ids"], enc["attention_mask"], enc.get("token_type_ids"), chosen_labels)

    return encode(fit_idx), encode(hold_idx)


def calibration_batches(cfg: CalibrationConfig, tokenizer, kind: str) -> tuple[CalibrationBatch, CalibrationBatch]:
    """``(fit, held_aside)`` batches of the recipe's calibration source for a ``kind`` of model."""
    texts = load_texts(cfg)
    if kind == "decoder":
        if cfg.label_field is not None:
            raise ValueError("calibration.label_field applies to encoder models; decoders use the language-model loss")
        return decoder_windows(texts, tokenizer, cfg)
    return encoder_samples(texts, tokenizer, cfg, load_labels(cfg))
