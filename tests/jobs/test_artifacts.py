"""A job's checkpoint as per-file artifacts (sizes and sha256 from its SHA256SUMS), the whole of it as
a tar made on the fly, stage timings, and a full disk — in-process (no worker), on the tiny model."""

from __future__ import annotations

import errno
import hashlib
import io
import os
import tarfile
from pathlib import Path

import pytest
from sqlalchemy import update

from jobs.artifacts import Served, TarStream, check_name, confined, is_no_space, no_space_errno
from jobs.db import Artifact, Job
from jobs.service import JobService
from jobs.settings import Settings
from jobs.store import Store
from jobs.tasks import execute
from jobs.timings import StageClock, rows
from tests.jobs.conftest import recipe
from tests.jobs.test_service import _FakeCelery


def _service(folder: Path) -> JobService:
    settings = Settings(data_dir=folder, database_url=f"sqlite:///{folder / 'jobs.db'}", broker_url="memory://")
    return JobService(settings, celery_app=_FakeCelery())


@pytest.fixture()
def service(tmp_path):
    return _service(tmp_path)


@pytest.fixture(scope="module")
def done(tmp_path_factory, job_models):
    """(service, job id) of a job run to success on the quick model, with one perplexity evaluation;
    shared by the module's tests, which leave it as they found it."""
    service = _service(tmp_path_factory.mktemp("finished"))
    evaluation = {"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 32}
    job_id = service.submit(recipe(job_models), evaluations=[evaluation])
    assert execute(job_id, service.settings) == "SUCCEEDED", service.show(job_id)["error"]
    return service, job_id


def test_each_checkpoint_file_is_an_artifact_with_its_sha256(done):
    service, finished = done
    info = service.show(finished, internal=True)
    kinds = [a["kind"] for a in info["artifacts"]]
    assert kinds[0] == "checkpoint" and set(kinds[1:]) == {"file"} and "archive" not in kinds
    checkpoint = Path(info["artifacts"][0]["path"])
    on_disk = sorted(p.relative_to(checkpoint).as_posix() for p in checkpoint.rglob("*") if p.is_file())
    files = info["artifacts"][1:]
    assert sorted(a["name"] for a in files) == on_disk and files[-1]["name"] == "SHA256SUMS"
    for a in files:
        data = (checkpoint / a["name"]).read_bytes()
        assert a["path"] == str(checkpoint / a["name"]) and a["size"] == len(data)
        assert a["sha256"] == hashlib.sha256(data).hexdigest(), a["name"]
    assert info["artifacts"][0]["size"] == sum(a["size"] for a in files)
    assert not list(checkpoint.parent.glob("*.tar*"))  # no archive beside the checkpoint
    assert [d["name"] for d in service.downloads(finished)] == [a["name"] for a in files]


def test_the_streamed_tar_holds_the_same_bytes(done):
    service, finished = done
    stream = service.checkpoint_tar(finished)
    chunks = list(stream)
    data = b"".join(chunks)
    assert len(data) == len(stream)  # the length announced before sending is exact
    assert max(len(c) for c in chunks) <= 1 << 20
    files = {f.name: f for f in service.served(finished)}
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = {m.name: m for m in tar.getmembers()}
        assert set(members) == {f"liar-job-{finished}/{name}" for name in files}
        for name, f in files.items():
            got = tar.extractfile(members[f"liar-job-{finished}/{name}"]).read()
            assert got == service.file(finished, name).path.read_bytes() and hashlib.sha256(got).hexdigest() == f.sha256


def test_stage_timings_are_recorded_and_logged(done):
    service, finished = done
    info = service.show(finished, internal=True)
    timings = info["timings"]
    stages = {e["stage"]: e for e in timings["stages"]}
    # streamed: the shards are written block by block, the rest of the checkpoint at "write"
    assert list(stages)[:6] == ["starting", "load", "calibration", "scoring", "reconstruct", "write"]
    assert list(stages)[-2:] == ["evaluate", "export"]
    assert all(e["seconds"] >= 0 for e in timings["stages"]) and timings["total"] > 0
    assert len(stages["reconstruct"]["steps"]) == info["n_layers"] == 2
    assert all(s >= 0 for s in stages["reconstruct"]["steps"])
    assert sum(e["seconds"] for e in timings["stages"]) <= timings["total"] + 1e-3
    log = [(x["level"], x["message"]) for x in info["log"]]
    messages = [m for _, m in log]
    assert any(m.startswith("load ") and m.endswith(" s") for m in messages)
    assert any(m.startswith("export ") for m in messages) and any(m.startswith("total ") for m in messages)
    assert [lvl for lvl, m in log if m.startswith("layer ")] == ["DEBUG", "DEBUG"]
    assert any(m.startswith("layer 2/2: ") for m in messages)


def test_a_full_disk_fails_the_job_in_one_sentence_and_leaves_nothing(service, job_models, monkeypatch):
    from core.pipeline.result import PruneResult

    def save(self, output_dir, overwrite=False):
        out = Path(output_dir)
        out.mkdir(parents=True)
        (out / "model.safetensors").write_bytes(b"\0" * 1000)  # a partial write
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(out / "model.safetensors"))

    monkeypatch.setattr(PruneResult, "save", save)
    job_id = service.submit(recipe(job_models))
    assert execute(job_id, service.settings) == "FAILED"
    info = service.show(job_id)
    out_dir = service.settings.artifacts_dir / f"job-{job_id}"
    assert info["error"].startswith("no space left on device while writing the checkpoint on the worker;")
    assert str(service.settings.data_dir) not in info["error"]  # users read it: the worker's log has the folder
    assert info["error"].count(". ") == 0 and "\n" not in info["error"]  # one sentence
    assert info["artifacts"] == [] and not out_dir.exists()
    export = info["timings"]["stages"][-1]
    assert export["stage"] == "export" and export["stopped"] is True
    with service.sessions() as s:
        assert s.query(Artifact).filter(Artifact.job_id == job_id).count() == 0


def test_a_disk_too_small_for_the_weights_is_refused_before_writing(service, job_models, monkeypatch):
    import shutil

    from core.pipeline.result import PruneResult

    monkeypatch.setattr(shutil, "disk_usage", lambda path: shutil._ntuple_diskusage(10**9, 10**9 - 100, 100))
    monkeypatch.setattr(PruneResult, "save", lambda *a, **k: pytest.fail("the checkpoint was written"))
    job_id = service.submit(recipe(job_models))
    assert execute(job_id, service.settings) == "FAILED"
    info = service.show(job_id)
    assert "not enough disk space on the worker to write the checkpoint" in info["error"]
    assert "0.00 GB are free" in info["error"] and info["artifacts"] == []


def test_quota_and_wrapped_errors_count_as_a_full_disk():
    assert is_no_space(OSError(errno.EDQUOT, "Disk quota exceeded"))
    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("could not save") from inner
    except RuntimeError as outer:
        assert is_no_space(outer)
    # safetensors' Rust writer reports it as text
    assert is_no_space(
        Exception(
            'Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "No space left on device" })'
        )
    )
    assert not is_no_space(OSError(errno.EACCES, "Permission denied"))
    assert not is_no_space(ValueError("bad recipe"))
    # a file past the file-size limit (ulimit -f) or the file system's largest file; which one it was
    assert no_space_errno(OSError(errno.EFBIG, "File too large")) == errno.EFBIG
    assert no_space_errno(Exception('IoError(Os { code: 27, kind: FileTooLarge, message: "File too large" })')) == 27
    assert no_space_errno(OSError(errno.EDQUOT, "Disk quota exceeded")) == errno.EDQUOT
    assert no_space_errno(Exception("StorageFull")) == errno.ENOSPC and no_space_errno(KeyError("x")) is None


def test_file_names_and_paths_stay_inside_the_job_folder(done, tmp_path):
    service, finished = done
    name = service.downloads(finished)[0]["name"]
    assert service.file(finished, name).path.is_file()
    for bad in ("../liar.db", "../../etc/passwd", "/etc/passwd", "a/../../x", "a\\b", "", "./config.json"):
        with pytest.raises(ValueError, match="is not a file name inside a checkpoint"):
            service.file(finished, bad)
    with pytest.raises(KeyError, match="has no file 'nope.bin'"):
        service.file(finished, "nope.bin")
    with pytest.raises(KeyError, match="no job 99"):
        service.file(99, "config.json")
    secret = tmp_path / "secret.txt"
    secret.write_text("not yours")
    row = update(Artifact).where(Artifact.job_id == finished, Artifact.name == name)
    key = service.file(finished, name).key
    # rows pointing outside the job's folder (tampered): a host's path, another job's key, a key that climbs out
    for outside in (str(secret), f"artifacts/job-{finished + 1}/checkpoint/{name}"):
        with service.sessions.begin() as s:
            s.execute(row.values(path=outside))
        try:
            with pytest.raises(PermissionError, match="outside the job's folder"):
                service.file(finished, name)
            with pytest.raises(PermissionError):
                service.checkpoint_tar(finished)
        finally:
            with service.sessions.begin() as s:
                s.execute(row.values(path=key))
    with service.sessions.begin() as s:
        s.execute(row.values(path=f"artifacts/job-{finished}/../job-{finished + 1}/{name}"))
    try:
        with pytest.raises(ValueError, match="not a key inside the store"):
            service.file(finished, name)
    finally:
        with service.sessions.begin() as s:
            s.execute(row.values(path=key))
    assert service.file(finished, name).path.is_file()
    with pytest.raises(ValueError):
        check_name("..")
    assert check_name("sub/dir/file.json") == "sub/dir/file.json"
    with pytest.raises(PermissionError):
        confined(tmp_path / "secret.txt", tmp_path / "artifacts")


def test_a_job_from_before_per_file_artifacts_still_offers_its_archive(service, job_models):
    """Rows written by the old exporter: a checkpoint directory and a .tar.gz (kind "archive")."""
    job_id = service.submit(recipe(job_models))
    folder = service.settings.artifacts_dir / f"job-{job_id}"
    (folder / "checkpoint").mkdir(parents=True)
    archive = folder / f"liar-job-{job_id}.tar.gz"
    archive.write_bytes(b"old archive")
    digest = hashlib.sha256(b"old archive").hexdigest()
    key = f"artifacts/job-{job_id}"  # as revision 0006 left them
    with service.sessions.begin() as s:
        s.add(Artifact(job_id=job_id, kind="checkpoint", path=f"{key}/checkpoint", size=0))
        s.add(Artifact(job_id=job_id, kind="archive", path=f"{key}/{archive.name}", size=11, sha256=digest))
        s.execute(update(Job).where(Job.id == job_id).values(status="SUCCEEDED"))
    assert service.downloads(job_id) == [{"name": archive.name, "size": 11, "sha256": digest, "kind": "archive"}]
    assert service.file(job_id, archive.name).path == archive.resolve()
    with pytest.raises(KeyError, match="has no checkpoint files"):
        service.checkpoint_tar(job_id)


def test_tar_stream_of_empty_large_and_nested_files(tmp_path):
    sizes = {"empty": 0, "one-block": 512, "odd": 1000, "sub/dir/big.bin": (1 << 20) * 2 + 3}
    served = []
    for name, size in sizes.items():
        path = tmp_path / "ckpt" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(os.urandom(size))
        served.append(Served(name, f"ckpt/{name}", size, None, "file"))
    store = Store(tmp_path, tmp_path / "cache")
    stream = TarStream(served, "x" * 120, store)  # a long prefix: names past ustar's 100 characters
    data = b"".join(stream)
    assert len(data) == len(stream)
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        tar.extractall(tmp_path / "out", filter="data")
    for name in sizes:
        assert (tmp_path / "out" / ("x" * 120) / name).read_bytes() == (tmp_path / "ckpt" / name).read_bytes()
    (tmp_path / "ckpt" / "odd").write_bytes(b"changed")  # the file changed after it was listed
    with pytest.raises(OSError, match="changed size"):
        b"".join(TarStream(served, "x", store))


def test_stage_clock_on_made_up_calls():
    t = [0.0]
    clock = StageClock(now=lambda: t[0])
    events = []

    def call(at, stage, done, total):
        t[0] = at
        events.extend(e.message for e in clock.update(stage, done, total))

    call(0, "load", 0, 1)
    call(2, "load", 1, 1)
    call(3, "calibration", 0, 1)  # 2 → 3: between stages
    call(4, "reconstruct", 0, 3)  # closes calibration (no end call)
    call(5, "reconstruct", 1, 3)
    call(7, "reconstruct", 2, 3)
    call(10, "reconstruct", 3, 3)
    call(10, "done", 1, 1)  # a marker: no stage
    call(11, "write", 0, 1)  # a stage this code has never heard of
    call(12.5, "load", 0, 1)  # a stage that comes back adds to its entry
    call(13, "load", 1, 1)
    t[0] = 14
    timings, last = clock.finish(stopped=False)
    assert timings == {
        "stages": [
            {"stage": "load", "seconds": 2.5},
            {"stage": "calibration", "seconds": 1.0},
            {"stage": "reconstruct", "seconds": 6.0, "steps": [1.0, 2.0, 3.0]},
            {"stage": "write", "seconds": 1.5},
        ],
        "total": 14.0,
    }
    assert (
        events
        == [
            "load 2.0 s",
            "calibration 1.0 s",
            "layer 1/3: 1.0 s",
            "layer 2/3: 2.0 s",
            "layer 3/3: 3.0 s",
            "reconstruct 6.0 s (3 layers; slowest: layer 3 at 3.0 s)",
            "write 1.5 s",
            "load 0.5 s",
        ]
        and last == []
    )
    table = dict(rows(timings))
    assert table["  layer 3/3"] == 3.0 and table["(between stages)"] == 3.0 and table["total"] == 14.0
    assert "  layer 1/3" not in dict(rows(timings, steps=False))


def test_stage_clock_when_a_job_stops_inside_a_stage():
    t = [0.0]
    clock = StageClock(now=lambda: t[0])
    clock.update("evaluate", 0, 2)
    t[0] = 1
    clock.update("evaluate", 1, 2)
    t[0] = 5
    timings, events = clock.finish(stopped=True)
    assert timings["stages"] == [{"stage": "evaluate", "seconds": 5.0, "steps": [1.0], "stopped": True}]
    assert [e.message for e in events] == ["evaluate 5.0 s (1 evaluation; slowest: evaluation 1 at 1.0 s) — stopped"]
