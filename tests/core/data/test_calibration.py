"""Calibration batches: trimming the padding a batch does not use changes no real token's computation."""

import torch

from core.data.calibration import CalibrationBatch, encoder_samples
from core.models.loading import load_model
from core.spec.recipe import CalibrationConfig


def _encoder_batch(bert_dir, corpus, n=12):
    _, tok, _ = load_model(str(bert_dir), "float32", "cpu")
    cfg = CalibrationConfig(texts=corpus, num_calibration_samples=n, max_seq_length=64, holdout_samples=0)
    # texts of very different lengths, so that batches of them use different widths
    texts = [" ".join(t.split()[: 3 + 7 * (i % 5)]) for i, t in enumerate(corpus)]
    fit, _ = encoder_samples(texts, tok, cfg)
    return fit


def test_slices_drop_only_the_padding_columns_no_sample_uses(bert_dir, corpus):
    fit = _encoder_batch(bert_dir, corpus)
    assert fit.input_ids.shape[1] == 64  # padded to max_seq_length
    widths = set()
    for i in range(0, len(fit), 4):
        part = fit.slice(i, i + 4)
        mask = fit.attention_mask[i : i + 4]
        longest = int(mask.sum(1).max())
        assert part.input_ids.shape == part.attention_mask.shape == (4, longest)
        assert part.token_type_ids is None or part.token_type_ids.shape == (4, longest)
        assert torch.equal(part.input_ids, fit.input_ids[i : i + 4, :longest])
        assert int(part.attention_mask.sum()) == int(mask.sum())  # every real token is still there
        widths.add(longest)
    assert len(widths) > 1
    # concat pads the trimmed batches back to one width, the real tokens where they were
    again = CalibrationBatch.concat([fit.slice(i, i + 4) for i in range(0, len(fit), 4)])
    width = again.input_ids.shape[1]
    assert width == max(widths)
    assert torch.equal(again.attention_mask, fit.attention_mask[:, :width])
    real = fit.attention_mask[:, :width].bool()
    assert torch.equal(again.input_ids[real], fit.input_ids[:, :width][real])


def test_a_trimmed_batch_gives_the_real_tokens_the_same_outputs(bert_dir, corpus):
    fit = _encoder_batch(bert_dir, corpus)
    model, _, adapter = load_model(str(bert_dir), "float32", "cpu")
    part = CalibrationBatch(fit.input_ids[:4], fit.attention_mask[:4]).slice(0, 4)
    assert part.input_ids.shape[1] < 64
    whole = CalibrationBatch(fit.input_ids[:4], fit.attention_mask[:4])
    with torch.no_grad():
        short = model.base_model(**part.model_inputs("encoder", "cpu")).last_hidden_state
        full = model.base_model(**whole.model_inputs("encoder", "cpu")).last_hidden_state
    mask = part.attention_mask.bool()
    torch.testing.assert_close(short[mask], full[:, : short.shape[1]][mask], rtol=1e-5, atol=1e-5)


def test_left_padded_batches_keep_their_width():
    ids = torch.tensor([[0, 0, 5, 6], [0, 7, 8, 9]])
    mask = (ids != 0).long()
    part = CalibrationBatch(ids, mask).slice(0, 2)
    assert torch.equal(part.input_ids, ids) and torch.equal(part.attention_mask, mask)
