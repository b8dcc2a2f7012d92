"""The store (``jobs.store``): keys, not paths, in the database; a folder (the default) or a real
S3-compatible server (moto's, on 127.0.0.1). Hosts here are data folders of their own sharing one
database and the store, as a web host and GPU workers share them: a job pruned on one host downloads,
is pruned again and re-evaluated on others; an upload on the web host reaches the worker; an attempt
that dies mid-upload leaves nothing listed; deletion and retention remove the objects."""

from __future__ import annotations

import dataclasses
import datetime as dt
import hashlib
import io
import tarfile
import urllib.request
from pathlib import Path

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import select, update

from app.web import downloads
from jobs.artifacts import attempt_key, publish
from jobs.db import Artifact, Job, JobLog
from jobs.health import Check
from jobs.service import JobService
from jobs.settings import Settings
from jobs.store import ChecksumMismatch, Store, check_key
from jobs.tasks import execute
from tests.jobs.conftest import recipe
from tests.jobs.test_service import _FakeCelery
from tests.s3server import new_bucket, objects, s3_server


@pytest.fixture(scope="module")
def s3():
    with s3_server() as endpoint:
        yield endpoint


@pytest.fixture(params=["folder", "s3"])
def store(request, tmp_path, s3):
    if request.param == "folder":
        return Store(tmp_path / "store", tmp_path / "cache")
    return Store(f"s3://{new_bucket(s3)}/team", tmp_path / "cache", endpoint_url=s3)


def test_put_fetch_read_and_delete(store, tmp_path):
    src = tmp_path / "src.bin"
    src.write_bytes(bytes(range(256)) * 9000)  # past one chunk
    digest = hashlib.sha256(src.read_bytes()).hexdigest()
    key = "artifacts/job-1/attempt-2/checkpoint/model.safetensors"
    assert store.put(src, key, digest) == (src.stat().st_size, digest)
    assert store.exists(key) and store.size(key) == src.stat().st_size
    assert store.children("artifacts/job-1") == ["attempt-2"] and store.children("artifacts/job-9") == []
    assert b"".join(store.chunks(key, 1000, 70000)) == src.read_bytes()[1000:71000]
    fetched = store.fetch(key, src.stat().st_size, digest)
    assert fetched.read_bytes() == src.read_bytes() and fetched == store.path(key)
    if store.local is None:  # a remote store's copy lands in this host's cache, once
        assert fetched.is_relative_to(tmp_path / "cache")
        assert store.url(key, "model.safetensors") is not None
    else:
        assert store.url(key, "model.safetensors") is None  # a folder is served by the app itself
    store.delete("artifacts/job-1")
    assert not store.exists(key) and store.children("artifacts/job-1") == []
    store.delete("artifacts/job-1")  # nothing there: nothing to do
    with pytest.raises(FileNotFoundError):
        Store(store.location, tmp_path / "other-cache", **_options(store)).fetch(key)


def _options(store: Store) -> dict:
    endpoint = getattr(store.fs, "client_kwargs", {}).get("endpoint_url") or getattr(store.fs, "endpoint_url", None)
    return {"endpoint_url": endpoint} if store.local is None else {}


def test_a_changed_source_or_a_corrupt_object_is_refused(store, tmp_path):
    src = tmp_path / "src.txt"
    src.write_text("the bytes the exporter hashed")
    with pytest.raises(ChecksumMismatch, match="changed while it was uploaded"):
        store.put(src, "uploads/a.txt", sha256="0" * 64)
    assert not store.exists("uploads/a.txt")  # nothing half-right left behind
    size, digest = store.put(src, "uploads/a.txt")
    with store.fs.open(f"{store.root}/uploads/a.txt", "wb") as f:  # the store's copy changes under us
        f.write(b"the bytes the exporter hashed, and more")
    other = Store(store.location, tmp_path / "cache-2", **_options(store))
    if other.local is None:
        with pytest.raises(ChecksumMismatch, match="not the file recorded"):
            other.fetch("uploads/a.txt", size, digest)
        assert not list((tmp_path / "cache-2").rglob("a.txt*"))  # no partial copy either


@pytest.mark.parametrize("key", ["", "../x", "/etc/passwd", "a//b", "a/./b", "a\\b", "a/.."])
def test_keys_are_plain_relative_paths(key, tmp_path):
    with pytest.raises(ValueError, match="not a key inside the store"):
        check_key(key)
    with pytest.raises(ValueError):
        Store(tmp_path, tmp_path / "cache").path(key)


def test_the_health_check_lists_the_stores_root(tmp_path, s3):
    from jobs.health import check_store

    def settings(url: str | None, endpoint: str | None = None) -> Settings:
        return Settings(data_dir=tmp_path, database_url="", broker_url="", store_url=url, store_endpoint=endpoint)

    assert check_store(settings(None)) == Check("store", True, str(tmp_path))
    bucket = new_bucket(s3)
    assert check_store(settings(f"s3://{bucket}/liar", s3)).ok
    missing = check_store(settings("s3://no-such-bucket/liar", s3))
    assert not missing.ok and missing.detail == "s3://no-such-bucket/liar: there is no such folder or bucket"
    down = check_store(settings(f"s3://{bucket}", "http://127.0.0.1:9"), timeout=3)  # nothing listens there
    assert not down.ok and down.detail.startswith(f"s3://{bucket}: ") and "\n" not in down.detail


# --- hosts with private data folders around one store -----------------------------------------------


class Hosts:
    """A web host and two workers: their own data folders; one database, one store."""

    def __init__(self, tmp_path: Path, store_url: str, endpoint: str | None, presign: bool = True):
        database = f"sqlite:///{tmp_path / 'jobs.db'}"

        def host(name: str) -> JobService:
            settings = Settings(
                data_dir=tmp_path / name,
                database_url=database,
                broker_url="memory://",
                store_url=store_url,
                store_endpoint=endpoint,
                presign=presign,
                data_roots=(tmp_path.parent,),  # the session's test models
            )
            return JobService(settings, celery_app=_FakeCelery())

        self.web, self.a, self.b = host("web"), host("worker-a"), host("worker-b")

    def run(self, job_id: int, on: JobService) -> None:
        assert execute(job_id, on.settings) == "SUCCEEDED", on.show(job_id, internal=True)["traceback"]


@pytest.fixture()
def hosts(tmp_path, s3):
    return Hosts(tmp_path, f"s3://{new_bucket(s3)}/liar", s3)


def _keys(service: JobService, job_id: int) -> list[str]:
    with service.sessions() as s:
        return list(s.scalars(select(Artifact.path).where(Artifact.job_id == job_id)))


def test_a_job_pruned_on_one_host_downloads_through_another(hosts, job_models, s3, tmp_path):
    job_id = hosts.web.submit(recipe(job_models))
    hosts.run(job_id, hosts.a)
    keys = _keys(hosts.web, job_id)
    assert keys and all(k.startswith(f"artifacts/job-{job_id}/attempt-1/checkpoint") for k in keys)
    bucket = hosts.web.settings.store_url.split("/")[2]
    stored = objects(s3, bucket, "liar/")
    files = hosts.web.served(job_id)
    assert {f"liar/{f.key}": f.size for f in files} == stored  # every file, nothing else, at its size
    assert not (hosts.a.settings.artifacts_dir / f"job-{job_id}").exists()  # the worker's copy is gone

    app = FastAPI()
    app.include_router(downloads.router(hosts.web))
    http = TestClient(app)
    config = next(f for f in files if f.name == "config.json")
    got = http.get(f"/jobs/{job_id}/files/config.json", follow_redirects=False)
    assert got.status_code == 307 and got.headers["location"].startswith(s3)  # signed: straight from the store
    with urllib.request.urlopen(got.headers["location"]) as answer:  # as a browser follows it, to the store
        body = answer.read()
        assert 'filename="config.json"' in answer.headers["Content-Disposition"]
    assert hashlib.sha256(body).hexdigest() == config.sha256

    tar = http.get(f"/jobs/{job_id}/checkpoint.tar")  # streamed through the app
    assert tar.status_code == 200 and int(tar.headers["content-length"]) == len(tar.content)
    with tarfile.open(fileobj=io.BytesIO(tar.content)) as archive:
        archive.extractall(tmp_path / "downloaded", filter="data")
    folder = tmp_path / "downloaded" / f"liar-job-{job_id}"
    for f in files:
        assert hashlib.sha256((folder / f.name).read_bytes()).hexdigest() == f.sha256, f.name
    from core.models.loading import load_pruned

    model, _ = load_pruned(folder)
    assert sum(p.numel() for p in model.parameters()) > 0

    unsigned = dataclasses.replace(hosts.web.settings, data_dir=tmp_path / "web-2", presign=False)
    http = TestClient(_app(JobService(unsigned, celery_app=_FakeCelery())))  # users cannot reach the store
    whole = http.get(f"/jobs/{job_id}/files/config.json")
    assert whole.status_code == 200 and hashlib.sha256(whole.content).hexdigest() == config.sha256
    part = http.get(f"/jobs/{job_id}/files/config.json", headers={"Range": "bytes=5-14"})
    assert part.status_code == 206 and part.content == whole.content[5:15]
    assert part.headers["content-range"] == f"bytes 5-14/{config.size}"
    assert http.get(f"/jobs/{job_id}/files/config.json", headers={"Range": "bytes=99999-"}).status_code == 416


def _app(service: JobService) -> FastAPI:
    app = FastAPI()
    app.include_router(downloads.router(service))
    return app


def test_uploads_references_and_reevaluation_cross_hosts(hosts, job_models, tmp_path):
    from app.web.forms import store_upload

    upload = tmp_path / "mine.txt"
    upload.write_text(job_models["calib"].read_text())
    named = store_upload(hosts.web, str(upload))
    assert named.startswith("upload:") and named.endswith(".txt")
    job_id = hosts.web.submit(recipe(job_models, calibration={**recipe(job_models)["calibration"], "dataset": named}))
    assert hosts.web.show(job_id)["recipe"]["calibration"]["dataset"] == named  # the key, not a host's path
    hosts.run(job_id, hosts.a)  # worker a reads the upload from the store
    assert (hosts.a.settings.data_dir / "cache" / "uploads").is_dir()

    # evaluated again on worker b: the web host checked the request from the checkpoint's small files,
    # b loads the weights
    evaluation = {"type": "perplexity", "dataset": str(job_models["calib"]), "seq_len": 32}
    job2 = hosts.web.submit(recipe(job_models), evaluations=[evaluation])
    hosts.run(job2, hosts.a)
    web_cache = hosts.web.settings.data_dir / "cache"
    redo = hosts.web.reevaluate(job2)
    assert not list(web_cache.rglob("*.safetensors"))  # the web host read the config, never the weights
    hosts.run(redo, hosts.b)
    assert list((hosts.b.settings.data_dir / "cache").rglob("*.safetensors"))  # b fetched the checkpoint
    assert "perplexity" in hosts.web.show(redo)["metrics"]


def test_a_job_named_by_id_is_loaded_from_the_store_on_another_worker(hosts, job_models):
    from jobs.tasks import _load_job

    first = hosts.web.submit(recipe(job_models))
    hosts.run(first, hosts.a)
    with hosts.web.sessions.begin() as s:  # a job naming it (the engine refuses to prune a pruned model at submit)
        s.add(Job(recipe=recipe(job_models, model=f"job:{first}"), evaluations=[], status="QUEUED"))
    (child,) = [j["id"] for j in hosts.web.list() if j["model"] == f"job:{first}"]
    loaded, _, named = _load_job(hosts.b.sessions, child, hosts.b.settings)
    folder = Path(loaded["model"])
    assert named == f"job:{first}" and folder.is_relative_to(hosts.b.settings.data_dir / "cache")
    for f in hosts.web.served(first):
        assert hashlib.sha256((folder / f.name).read_bytes()).hexdigest() == f.sha256, f.name


def test_an_attempt_that_dies_mid_upload_leaves_nothing_listed(hosts, job_models, monkeypatch, s3):
    """The first attempt's worker dies after its first file reached the store: no row lists any of it,
    the download routes find nothing, and the attempt that replaces it removes the orphans."""
    job_id = hosts.web.submit(recipe(job_models))
    store = hosts.a.settings.store()
    real_put, sent = Store.put, []

    def dies_after_one(self, src, key, sha256=None):
        if sent:
            raise SystemExit("killed")  # what a SIGKILL looks like from here: nothing after it runs
        sent.append(key)
        return real_put(self, src, key, sha256)

    monkeypatch.setattr(Store, "put", dies_after_one)
    with pytest.raises(SystemExit):
        execute(job_id, hosts.a.settings)
    monkeypatch.setattr(Store, "put", real_put)
    assert sent and store.exists(sent[0])  # one object made it
    assert hosts.web.downloads(job_id) == [] and _keys(hosts.web, job_id) == []
    http = TestClient(_app(hosts.web))
    assert http.get(f"/jobs/{job_id}/checkpoint.tar").status_code == 404
    with hosts.web.sessions.begin() as s:  # the reaper's verdict on the dead worker: queued again
        s.execute(update(Job).where(Job.id == job_id).values(status="QUEUED"))
    hosts.run(job_id, hosts.b)
    bucket = hosts.web.settings.store_url.split("/")[2]
    left = objects(s3, bucket, f"liar/artifacts/job-{job_id}/")
    assert left and all(k.startswith(f"liar/{attempt_key(job_id, 2)}/") for k in left)  # attempt 1's orphan gone


def test_deleting_a_job_or_its_retention_removes_its_objects(hosts, job_models, s3):
    bucket = hosts.web.settings.store_url.split("/")[2]
    gone, kept = (hosts.web.submit(recipe(job_models)) for _ in range(2))
    for job_id in (gone, kept):
        hosts.run(job_id, hosts.a)
    hosts.web.delete(gone)
    assert objects(s3, bucket, f"liar/artifacts/job-{gone}/") == {}
    assert hosts.web.expire(days=1) == []  # finished just now: kept
    _age(hosts.web, kept, days=3)
    assert hosts.web.expire(days=2) == [kept] and hosts.web.expire(days=2) == []
    assert objects(s3, bucket, f"liar/artifacts/job-{kept}/") == {}
    info = hosts.web.show(kept)
    assert info["status"] == "SUCCEEDED" and info["metrics"] and info["artifacts"] == []  # the record stays
    assert info["log"][-1]["message"] == "files removed after 2 days (retention)"
    with hosts.web.sessions() as s:
        assert s.scalar(select(JobLog.level).where(JobLog.job_id == kept).order_by(JobLog.id.desc())) == "INFO"


def _age(service: JobService, job_id: int, days: int) -> None:
    """The job finished ``days`` days earlier than it did."""
    with service.sessions.begin() as s:
        job = s.get(Job, job_id)
        job.finished_at -= dt.timedelta(days=days)


def test_retention_on_the_default_folder_store(tmp_path, job_models):
    settings = Settings(data_dir=tmp_path, database_url=f"sqlite:///{tmp_path / 'jobs.db'}", broker_url="memory://")
    service = JobService(settings, celery_app=_FakeCelery())
    job_id = service.submit(recipe(job_models))
    assert execute(job_id, settings) == "SUCCEEDED"
    assert settings.store().in_place(tmp_path) and _keys(service, job_id)[0].startswith(f"artifacts/job-{job_id}/")
    assert service.file(job_id, "config.json").path.is_file()  # served from the folder itself
    _age(service, job_id, days=10)
    assert service.expire() == []  # no LIAR_RETENTION_DAYS: nothing expires
    assert service.expire(days=7) == [job_id]
    assert not (settings.artifacts_dir / f"job-{job_id}").exists() and service.downloads(job_id) == []


def test_publish_to_the_folder_store_copies_nothing(tmp_path):
    store = Store(tmp_path, tmp_path / "cache")
    checkpoint = tmp_path / "artifacts" / "job-3" / "attempt-1" / "checkpoint"
    checkpoint.mkdir(parents=True)
    assert publish(store, tmp_path, checkpoint, []) == "artifacts/job-3/attempt-1/checkpoint"
