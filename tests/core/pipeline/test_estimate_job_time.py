"""The estimate of a CPU job's whole time (``core.pipeline.estimate.with_job_time``): the prune at the
worker's GEMM rate, the job's start and checkpoint traffic, and the perplexity evaluation's forward
passes; and the New-run line at the rate the server's workers reported (``app.web.preview``)."""

from __future__ import annotations

import json

import pytest

from bench.shapes import LLAMA_SHAPES
from core.pipeline import estimate
from core.pipeline.costs import shape_of

SMOLLM2 = dict(model_type="llama", max_position_embeddings=8192, dtype="bfloat16", **LLAMA_SHAPES["135m"])


@pytest.fixture()
def smollm2_config(tmp_path):
    path = tmp_path / "smollm2"
    path.mkdir()
    (path / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"], **SMOLLM2}))
    (path / "model.safetensors").write_bytes(b"")
    return path


def _recipe(model, samples=128, seq_len=128):
    return dict(
        model=str(model), ratio=0.2, criterion={"name": "auto"}, reconstruction={"method": "ls"},
        calibration={"dataset": "wikitext2", "num_calibration_samples": samples, "max_seq_length": seq_len},
    )  # fmt: skip


def test_evaluation_counts_the_windows_the_text_holds(tmp_path):
    text = tmp_path / "held.txt"
    text.write_text("x" * int(estimate.BYTES_PER_TOKEN * 128 * 10))  # ten 128-token windows
    ev = {"type": "perplexity", "dataset": str(text), "seq_len": 128}
    assert estimate.evaluation_flops([{**ev, "max_windows": 64}], 100, 80) == 2.0 * (80 + 100) * 10 * 128
    assert estimate.evaluation_flops([{**ev, "max_windows": 4}], 100, 80) == 2.0 * (80 + 100) * 4 * 128
    named = {"type": "perplexity", "dataset": "wikitext2", "seq_len": 512}
    assert estimate.evaluation_flops([named], 100, 80) == 0.0  # its size is not known offline
    assert estimate.evaluation_flops([{**named, "max_windows": 2}], 100, 80) == 2.0 * 180 * 2 * 512
    assert estimate.evaluation_flops([{"type": "lm_eval", "tasks": ["piqa"]}], 100, 80) == 0.0


def test_a_cpu_job_is_its_prune_plus_start_checkpoint_and_evaluation(tmp_path, smollm2_config):
    text = tmp_path / "held.txt"
    text.write_text("x" * 800_000)
    evals = [{"type": "perplexity", "dataset": str(text), "seq_len": 128, "max_windows": 64}]
    worker = estimate.worker_class("cpu", gemm_rate=1e11)
    bare = estimate.estimate(_recipe(smollm2_config), worker)
    job = estimate.estimate(_recipe(smollm2_config), worker, evaluations=evals)
    assert bare.ok and job.ok
    prune = estimate.seconds_of(dict(job.flops), worker)
    size = (bare.params_before + bare.params_after) * (4 if job.dtype == "float32" else 2)
    io = estimate.JOB_START_S + size / estimate.CHECKPOINT_BYTES_PER_S
    evaluation = 2.0 * (bare.params_before + bare.params_after) * 64 * 128 / worker.dense_rate
    assert bare.seconds == pytest.approx(prune + io)
    assert job.seconds == pytest.approx(prune + io + evaluation)
    assert "to start" in job.basis and "perplexity" in job.basis
    # at half the worker's GEMM rate, the products take twice as long; the start does not
    slow = estimate.estimate(_recipe(smollm2_config), estimate.worker_class("cpu", gemm_rate=5e10), evaluations=evals)
    assert slow.seconds == pytest.approx(2 * (prune + evaluation) + io)


def test_a_gpu_class_still_times_the_prune_alone(smollm2_config):
    recipe = {**_recipe(smollm2_config), "device": "cuda", "dtype": "bfloat16"}
    guess = estimate.estimate(recipe, "h100-80gb", evaluations=[{"type": "perplexity", "dataset": "x"}])
    assert guess.seconds == pytest.approx(estimate.seconds_of(dict(guess.flops), estimate.worker_class("h100-80gb")))


def test_the_form_estimates_at_the_rate_its_workers_reported(tmp_path, smollm2_config, monkeypatch):
    from app.web import forms, preview
    from jobs import health
    from jobs.service import JobService
    from jobs.settings import Settings

    service = JobService(
        Settings(
            data_dir=tmp_path / "data",
            database_url=f"sqlite:///{tmp_path / 'l.db'}",
            broker_url="memory://rates",
            data_roots=(tmp_path,),
        )
    )
    text = tmp_path / "calib.txt"
    text.write_text("some text\n")
    answers = {"w@h": {"queues": ["liar"], "device": {"kind": "cpu", "name": "CPU", "gemm_flops": 3e10}}}
    asked = []
    monkeypatch.setattr(health, "ask_workers", lambda celery, command, timeout: asked.append(command) or answers)
    monkeypatch.setattr(preview, "_asked", {})
    form = (
        str(smollm2_config), "both", "0.2", "auto", "auto", "free", "auto", 0.001, str(text), None, "text", "",
        128, 128, 0, [], forms.NO_EVALUATION, "", "", ["ls"],
    )  # fmt: skip
    seconds = preview.estimate_seconds(service, form)
    expected = estimate.estimate(_recipe(smollm2_config), estimate.worker_class("cpu", gemm_rate=3e10))
    assert seconds == pytest.approx(expected.seconds)
    line = preview.estimate_line(service, form)
    assert line.endswith(f"≈ {estimate.duration(expected.seconds)} on this server's CPU"), line
    assert len(asked) == 1  # asked once, then kept for ASK_EVERY seconds
    assert shape_of(SMOLLM2).layers == 30


@pytest.mark.parametrize(("broker", "waits"), [("filesystem://", 2.5), ("redis://127.0.0.1:1/0", 0.5)])
def test_the_workers_are_asked_long_enough_for_their_broker_to_answer(tmp_path, monkeypatch, broker, waits):
    """The filesystem broker (the default, no server) polls its folders once a second on each side: a
    worker's answer takes up to two seconds, so the rate is asked for longer there (asked for 0.5 s, no
    worker was ever heard, and the estimate timed the web process's own CPU instead)."""
    from app.web import preview
    from jobs import health
    from jobs.service import JobService
    from jobs.settings import Settings

    settings = Settings(data_dir=tmp_path / "d", database_url=f"sqlite:///{tmp_path / 'l.db'}", broker_url=broker)
    answers = {"w@h": {"queues": ["liar"], "device": {"kind": "cpu", "name": "CPU", "gemm_flops": 2e11}}}
    timeouts = []
    monkeypatch.setattr(health, "ask_workers", lambda celery, command, timeout: timeouts.append(timeout) or answers)
    monkeypatch.setattr(preview, "_asked", {})
    assert preview.reported_rate(JobService(settings)) == 2e11
    assert timeouts == [waits]
