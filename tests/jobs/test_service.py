"""The job service and task logic in-process (no worker): failures, retries, leases, queries."""

from __future__ import annotations

import datetime as dt
import logging
import re

import pytest
from sqlalchemy import update

from jobs.db import Job, Status, utcnow
from jobs.service import JobService, NotNow, QueueError, SubmitError
from jobs.settings import Settings
from jobs.tasks import execute
from tests.jobs.conftest import recipe


class _FakeCelery:
    """Records sent messages instead of talking to a broker."""

    def __init__(self):
        self.sent = []

    def send_task(self, name, args):
        self.sent.append((name, args))

        class R:
            id = f"msg-{len(self.sent)}"

        return R()


@pytest.fixture()
def service(tmp_path):
    settings = Settings(
        data_dir=tmp_path,
        database_url=f"sqlite:///{tmp_path / 'jobs.db'}",
        broker_url="memory://",
        lease_seconds=5,
        max_attempts=2,
    )
    return JobService(settings, celery_app=_FakeCelery())


def test_failed_job_records_error_and_traceback(service, job_models, caplog):
    job_id = service.submit(recipe(job_models, calibration={"texts": ["too short"], "max_seq_length": 32}))
    with caplog.at_level(logging.ERROR, logger="liar.errors"):
        assert execute(job_id, service.settings) == "FAILED"
    info = service.show(job_id, internal=True)  # the operator's view has the traceback; users' has none
    assert info["status"] == "FAILED" and "fewer than the" in info["error"]
    assert "Traceback" in info["traceback"] and info["artifacts"] == []
    shown = service.show(job_id)
    assert "traceback" not in shown and not shown["error"].startswith(("ValueError", "RuntimeError"))
    # users read one sentence and an error id; the worker's log has the traceback under that id
    error_id = re.search(r"\(error id (\w+); the server log has the details\)$", shown["error"]).group(1)
    logged = next(r for r in caplog.records if error_id in r.getMessage())
    assert logged.exc_info is not None and f"job {job_id}" in logged.getMessage()
    assert execute(job_id, service.settings) == "skipped"  # a duplicate message does not run it again


def test_a_jobs_checkpoint_is_named_by_its_id(service, job_models):
    """``model: job:N`` resolves to job N's checkpoint, at submission (the engine's checks then see
    that folder: it is pruned already, which the engine refuses) and on the worker; the job names
    the job, never the folder; a reference whose job is gone fails in one sentence."""
    from jobs.tasks import _load_job

    first = service.submit(recipe(job_models))
    assert execute(first, service.settings) == "SUCCEEDED"
    checkpoint = str(service.artifact(first))
    with pytest.raises(SubmitError, match="this model is already pruned") as refused:
        service.submit(recipe(job_models, model=f"job:{first}", ratio=0.2))
    assert checkpoint not in str(refused.value)
    with service.sessions.begin() as s:  # a job naming it (as one queued before this check would)
        s.add(Job(recipe=recipe(job_models, model=f"job:{first}"), evaluations=[], status=Status.QUEUED.value))
    (child,) = [j["id"] for j in service.list() if j["model"] == f"job:{first}"]
    loaded, _, named = _load_job(service.sessions, child, service.settings)
    assert loaded["model"] == checkpoint and named == f"job:{first}"
    with pytest.raises(NotNow, match=f"job {child} reads job {first}'s checkpoint"):
        service.delete(first)  # refused while the child waits for it
    with service.sessions.begin() as s:  # as if the child had been queued after the delete began
        s.get(Job, child).status = Status.CANCELLED.value
    service.delete(first)
    with service.sessions.begin() as s:
        s.get(Job, child).status = Status.QUEUED.value
    assert execute(child, service.settings) == "FAILED"  # the parent went before the child ran: it says so
    assert service.show(child)["error"].startswith(f"model job:{first}: job {first} was deleted on ")


def test_transient_error_requeues_then_fails(service, job_models, monkeypatch):
    import core.pipeline.sequential

    def flaky(*a, **k):
        raise ConnectionError("hub unreachable")

    monkeypatch.setattr(core.pipeline.sequential, "prune", flaky)
    job_id = service.submit(recipe(job_models))
    with pytest.raises(ConnectionError):
        execute(job_id, service.settings)
    assert service.show(job_id)["status"] == "QUEUED"  # attempt 1 of 2: back in the queue
    with pytest.raises(ConnectionError):
        execute(job_id, service.settings)
    info = service.show(job_id)
    assert info["status"] == "FAILED" and "transient error" in info["error"] and info["attempts"] == 2


def test_stale_heartbeat_requeues_then_fails(service, job_models):
    job_id = service.submit(recipe(job_models))
    old = utcnow() - dt.timedelta(seconds=60)
    for attempt in (1, 2):
        with service.sessions.begin() as s:
            s.execute(
                update(Job)
                .where(Job.id == job_id)
                .values(status=Status.RUNNING.value, heartbeat_at=old, attempts=attempt, worker="gone:1")
            )
        assert service.reap() == [job_id]
    info = service.show(job_id)
    assert info["status"] == "FAILED" and "worker gone:1 lost" in info["error"]
    assert [m for _, m in service.celery.sent].count([job_id]) == 2  # submitted, then re-sent once


def test_cancel_request_is_honoured_at_layer_boundary(service, job_models):
    job_id = service.submit(recipe(job_models))
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(cancel_requested=True))
    # the claim succeeds (it was still QUEUED in the row) and the first progress call stops the run
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(status=Status.QUEUED.value))
    assert execute(job_id, service.settings) == "CANCELLED"
    assert service.show(job_id)["artifacts"] == []


def test_unknown_job(service):
    with pytest.raises(KeyError, match="no job 99"):
        service.show(99)
    with pytest.raises(KeyError, match="no job 99"):
        service.cancel(99)


def test_broker_failure_creates_no_job(tmp_path, job_models):
    class Down(_FakeCelery):
        def send_task(self, name, args):
            raise ConnectionError("connection refused")

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'j.db'}", broker_url="memory://")
    service = JobService(settings, celery_app=Down())
    with pytest.raises(RuntimeError, match="could not queue the job"):
        service.submit(recipe(job_models))
    assert service.list() == []


def test_a_broker_failure_never_shows_the_brokers_password(tmp_path, job_models, caplog):
    url = "redis://:s3cret-pw@broker.internal:6379/0"

    class Down(_FakeCelery):
        def send_task(self, name, args):  # a client error that quotes what it was given
            raise ConnectionError(f"Error 111 connecting to {url} (password s3cret-pw)")

    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'j.db'}", broker_url=url)
    service = JobService(settings, celery_app=Down())
    with pytest.raises(QueueError) as caught, caplog.at_level(logging.ERROR):
        service.submit(recipe(job_models))
    message = str(caught.value)
    # users read one sentence with an error id: no URL, host or password
    assert "s3cret-pw" not in message and "broker.internal" not in message and "redis://" not in message
    assert message.startswith("could not queue the job: the job broker did not take it")
    error_id = re.search(r"error id (\w+)", message).group(1)
    # the server log has the detail under that id, the password masked
    logged = [r.getMessage() for r in caplog.records if error_id in r.getMessage()]
    assert logged and "redis://:***@broker.internal:6379/0" in logged[0] and "s3cret-pw" not in logged[0]
    assert service.list() == []


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:pw@h:6379/0", "redis://:***@h:6379/0"),
        ("redis://user:pw@h/1", "redis://user:***@h/1"),
        ("postgresql+psycopg://liar:p%40ss@db:5432/liar", "postgresql+psycopg://liar:***@db:5432/liar"),
        ("redis://h:6379/0", "redis://h:6379/0"),
        ("filesystem://", "filesystem://"),
    ],
)
def test_redact_url_hides_only_the_password(url, shown):
    from jobs.settings import redact_url

    assert redact_url(url) == shown


def test_sweep_cells_are_the_grid_expansion(service, job_models):
    from core.spec.sweep import expand_grid

    evaluation = {"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 16}
    base = recipe(job_models, reconstruction={"method": "liar", "damp": 0.01})
    group, ids = service.submit_sweep(base, ratios=[0.2, 0.4], methods=["bias", "ls"], evaluations=[evaluation])
    assert len(ids) == 4 and len(service.celery.sent) == 4
    jobs = [service.show(i) for i in ids]
    assert all(j["group_id"] == group for j in jobs)
    assert [(j["ratio"], j["method"]) for j in jobs] == [(0.2, "bias"), (0.2, "ls"), (0.4, "bias"), (0.4, "ls")]
    assert all(j["recipe"]["reconstruction"]["damp"] == 0.01 for j in jobs)  # other base fields are kept
    full = service.validate(base)[0]
    cells = expand_grid(full, {"ratio": [0.2, 0.4], "reconstruction": ["bias", "ls"]})
    expected = [service.validate(c.recipe)[0] for c in cells]
    assert [j["recipe"] for j in jobs] == expected
    assert jobs[0]["evaluations"] == [{**evaluation, "max_windows": None, "batch_size": 4}]


def test_invalid_sweep_creates_no_job(service, job_models):
    calib = str(job_models["calib"])
    for kwargs, message in (
        ({"methods": ["liar", "liar"]}, "grid.reconstruction: duplicated entries"),
        ({"ratios": [0.2, 1.5]}, "ratio 1.5 is not strictly between 0 and 1"),
        ({"criteria": ["magnitude", "nonsense"]}, "unknown criterion 'nonsense'"),
        ({"evaluations": [{"dataset": calib, "seq_len": 1}]}, "seq_len: Input should be greater than or equal to 2"),
        ({"evaluations": [{"dataset": calib + ".missing"}]}, "is neither a named set"),
        ({"evaluations": [{"dataset": calib, "type": "accuracy"}]}, "unknown evaluation type 'accuracy'"),
    ):
        with pytest.raises(SubmitError, match=message):
            service.submit_sweep(recipe(job_models), **{"ratios": [0.2], **kwargs})
    assert service.list() == [] and service.celery.sent == []


# --- serving forms (the recipe's export) ---------------------------------------------------------


@pytest.fixture(scope="module")
def serving_models(tmp_path_factory):
    """Tiny decoders GGUF export can and cannot write: LLaMA with a byte-level BPE tokenizer (can), the
    default WordLevel tokenizer and an OPT (cannot), a Gemma 3 (only pruned to one width without biases)."""
    from core.models.tiny import tiny_decoder

    base = tmp_path_factory.mktemp("serving_models")
    return {
        "llama": tiny_decoder(base / "llama-bpe", tokenizer="bpe"),
        "words": tiny_decoder(base / "llama-words"),
        "opt": tiny_decoder(base / "opt-bpe", family="opt", tokenizer="bpe"),
        "gemma3": tiny_decoder(base / "gemma3-bpe", family="gemma3", tokenizer="bpe"),
    }


def test_a_model_that_cannot_be_exported_is_refused_at_submission(service, job_models, serving_models):
    refusals = {
        "opt": "invalid recipe: export: GGUF export writes the LLaMA, Mistral, Qwen2, Qwen3, Gemma 2, Gemma 3 (text) "
        "and Phi-3 families; this checkpoint is OPT",
        "words": "invalid recipe: export: cannot write the tokenizer into the GGUF: it is WordLevel",
    }
    for name, message in refusals.items():
        with pytest.raises(SubmitError) as caught:
            service.submit(recipe(job_models, model=str(serving_models[name]), export=["gguf-f16"]))
        assert str(caught.value).startswith(message) and "\n" not in str(caught.value)
        with pytest.raises(SubmitError, match="GGUF"):  # a sweep checks once, before any cell is queued
            service.submit_sweep(recipe(job_models, model=str(serving_models[name]), export=["gguf-f16"]), [0.2, 0.3])
    with pytest.raises(SubmitError, match="export: 'gguf-q5' is not a serving form; choose from gguf-f16"):
        service.submit(recipe(job_models, model=str(serving_models["llama"]), export=["gguf-q5"]))
    assert service.list() == [] and service.celery.sent == []  # nothing queued
    # without export, the same models are pruned as before; the LLaMA with a BPE tokenizer is accepted
    assert service.submit(recipe(job_models, model=str(serving_models["words"]))) == 1
    assert service.submit(recipe(job_models, model=str(serving_models["llama"]), export=["gguf-f16"])) == 2
    assert service.show(2)["recipe"]["export"] == ["gguf-f16"]


def test_a_recipe_whose_checkpoint_llama_cpp_cannot_hold_is_refused_at_submission(service, job_models, serving_models):
    """Gemma 3 exports only pruned to one width without added biases: the default recipe is refused before
    anything is queued; a sweep is checked cell by cell (its methods, not the base recipe's)."""
    gemma = str(serving_models["gemma3"])
    with pytest.raises(SubmitError) as caught:
        service.submit(recipe(job_models, model=gemma, export=["gguf-f16"]))
    message = str(caught.value)
    assert message.startswith("invalid recipe: export: llama.cpp's gemma3 architecture has one number of query heads")
    assert message.endswith(
        "this recipe would give layers of different widths and the biases its reconstruction adds: prune with "
        "allocation: uniform, round_to.kv_groups: whole and reconstruction.method none or mask_tuning"
    )
    fits = recipe(job_models, model=gemma, export=["gguf-f16"], allocation="uniform", round_to={"kv_groups": "whole"})
    with pytest.raises(SubmitError, match="the biases its reconstruction adds: prune with reconstruction.method none"):
        service.submit_sweep(fits, methods=["none", "ls"])  # its ls cell
    assert service.list() == [] and service.celery.sent == []
    _, ids = service.submit_sweep(fits, methods=["none", "mask_tuning"])  # the base's ls is no cell
    assert [service.show(i)["recipe"]["reconstruction"]["method"] for i in ids] == ["none", "mask_tuning"]


def _artifact_files(info) -> dict:
    return {a["name"]: a for a in info["artifacts"] if a["kind"] == "file"}


def test_a_job_writes_its_serving_files_into_the_checkpoint(service, job_models, serving_models):
    from core.models.manifest import read_manifest

    job_id = service.submit(recipe(job_models, model=str(serving_models["llama"]), export=["gguf-f16"]))
    assert execute(job_id, service.settings) == "SUCCEEDED", service.show(job_id)["error"]
    info = service.show(job_id)
    checkpoint = service.artifact(job_id)
    gguf = [name for name in _artifact_files(info) if name.endswith(".gguf")]
    assert gguf == [f"{checkpoint.name}-f16.gguf"]
    assert (checkpoint / gguf[0]).read_bytes()[:4] == b"GGUF"
    listed = {e.name: e for e in read_manifest(checkpoint)}
    assert listed[gguf[0]].sha256 == _artifact_files(info)[gguf[0]]["sha256"]  # in SHA256SUMS, as served
    assert gguf[0] in (checkpoint / "README.md").read_text()
    assert service.file(job_id, gguf[0]).size == (checkpoint / gguf[0]).stat().st_size  # downloadable
    assert info["metrics"]["export_written"] == 1 and info["metrics"]["export_failed"] == 0
    assert any(x["message"].startswith(f"export gguf-f16: {gguf[0]} (") for x in info["log"])
    export_stage = next(s for s in info["timings"]["stages"] if s["stage"] == "export")
    assert len(export_stage["steps"]) == 2  # saving the checkpoint, then the form


def test_an_export_that_fails_after_the_prune_keeps_the_checkpoint(service, job_models, serving_models, monkeypatch):
    import core.serving

    def refuse(*args, **kwargs):  # each form's writer (the job's export writes them one by one)
        raise core.serving.ExportError("llama.cpp did not answer 'quantize' within 600 s")

    monkeypatch.setattr(core.serving, "write_form", refuse)
    job_id = service.submit(recipe(job_models, model=str(serving_models["llama"]), export=["gguf-f16", "gguf-q8_0"]))
    assert execute(job_id, service.settings) == "SUCCEEDED"
    info = service.show(job_id)
    checkpoint = service.artifact(job_id)
    assert (checkpoint / "config.json").is_file() and "config.json" in _artifact_files(info)
    assert not any(name.endswith(".gguf") for name in _artifact_files(info))
    assert info["error"] is None and info["metrics"]["params_after"] > 0  # the prune's result stands
    assert info["metrics"]["export_written"] == 0 and info["metrics"]["export_failed"] == 2
    warnings = [x["message"] for x in info["log"] if x["level"] == "WARNING"]
    assert warnings == [
        f"export {form} failed; the checkpoint is kept: llama.cpp did not answer 'quantize' within 600 s"
        for form in ("gguf-f16", "gguf-q8_0")
    ]


def test_the_worker_checks_the_forms_again_before_pruning(service, job_models, serving_models, monkeypatch):
    """The machine that took the job is not always the one that runs it (llama.cpp may be missing
    there), and a hub model is first seen by the worker: it checks before any pruning."""
    import core.pipeline.sequential
    import core.serving

    job_id = service.submit(recipe(job_models, model=str(serving_models["llama"]), export=["gguf-q4_k_m"]))

    def lacks_llama_cpp(model_dir, forms, **kw):
        raise core.serving.ExportError("gguf-q4_k_m needs llama.cpp's quantizer, which this machine lacks")

    def never(*args, **kwargs):
        raise AssertionError("pruned before the export check")

    monkeypatch.setattr(core.serving, "preflight", lacks_llama_cpp)
    monkeypatch.setattr(core.pipeline.sequential, "prune", never)
    assert execute(job_id, service.settings) == "FAILED"
    info = service.show(job_id)
    assert info["error"] == (
        "export gguf-q4_k_m refused before pruning: gguf-q4_k_m needs llama.cpp's quantizer, which this machine lacks"
    )
    assert info["artifacts"] == [] and not (service.settings.artifacts_dir / f"job-{job_id}").exists()


def test_a_sweep_checks_its_serving_forms_once(service, job_models, serving_models, monkeypatch):
    """Its cells share the model and the forms; the check reads the tokenizer (~0.5 s on SmolLM2)."""
    import core.serving

    calls = []
    monkeypatch.setattr(core.serving, "preflight", lambda model_dir, forms, **kw: calls.append((model_dir, forms)))
    base = recipe(job_models, model=str(serving_models["llama"]), export=["gguf-f16"])
    _, ids = service.submit_sweep(base, ratios=[0.2, 0.3], methods=["bias", "ls"])
    assert len(ids) == 4 and calls == [(serving_models["llama"], ["gguf-f16"])]


def test_an_evaluation_that_fails_after_the_prune_keeps_the_checkpoint(service, job_models, tmp_path):
    """The held-out text is gone by the time the job evaluates (a share unmounted, a hub outage): the
    pruned model is still exported and the job SUCCEEDED, the failure a WARNING line with an error id."""
    held = tmp_path / "held-out.txt"
    held.write_text(job_models["calib"].read_text())
    ev = [{"type": "perplexity", "dataset": str(held), "seq_len": 32}]
    job_id = service.submit(recipe(job_models), evaluations=ev)
    held.unlink()
    assert execute(job_id, service.settings) == "SUCCEEDED", service.show(job_id)["error"]
    info = service.show(job_id)
    assert info["metrics"]["evaluations_failed"] == 1 and "perplexity" not in info["metrics"]
    assert any(a["kind"] == "checkpoint" for a in info["artifacts"]) and service.artifact(job_id).is_dir()
    (line,) = [x for x in info["log"] if "failed; the checkpoint is kept" in x["message"]]
    assert line["level"] == "WARNING" and line["message"].startswith("evaluation 1 (perplexity on held-out.txt)")
    assert "error id" in line["message"] and str(tmp_path) not in line["message"]
