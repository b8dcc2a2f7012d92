"""Checkpoint downloads over HTTP (``app.web.downloads``) and how the web app lists them and the stage
timings (``app.web.listings``), on a job run in-process on the tiny model."""

from __future__ import annotations

import hashlib
import io
import tarfile

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import update

from app.web import downloads, listings, views
from jobs.db import Artifact, Job
from jobs.tasks import execute


@pytest.fixture()
def finished(job_service, llama_dir, corpus):
    """(service, job id, HTTP client of the download routes) for a job run to success."""
    calibration = {"texts": corpus, "num_calibration_samples": 8, "max_seq_length": 24}
    job_id = job_service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": calibration})
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    app = FastAPI()
    app.include_router(downloads.router(job_service))
    return job_service, job_id, TestClient(app)


def test_each_file_and_the_whole_checkpoint_download(finished, tmp_path):
    service, job_id, http = finished
    listing = listings.download_listing(service, job_id)
    assert listing["checkpoint_tar"] == f"jobs/{job_id}/checkpoint.tar"
    names = [f["name"] for f in listing["files"]]
    assert "config.json" in names and names[-1] == "SHA256SUMS"
    for f in listing["files"]:
        got = http.get("/" + f["url"])
        assert got.status_code == 200, got.text
        assert len(got.content) == f["size"] and hashlib.sha256(got.content).hexdigest() == f["sha256"]
        assert got.headers["content-disposition"].startswith("attachment")
    part = http.get(f"/jobs/{job_id}/files/config.json", headers={"Range": "bytes=0-9"})
    assert part.status_code == 206 and len(part.content) == 10  # a broken download resumes

    whole = http.get(f"/{listing['checkpoint_tar']}")
    assert whole.status_code == 200 and whole.headers["content-type"] == "application/x-tar"
    assert int(whole.headers["content-length"]) == len(whole.content)
    assert listing["checkpoint_tar_size"] == len(whole.content)  # the model page's size is the tar's own
    assert whole.headers["content-disposition"] == f'attachment; filename="liar-job-{job_id}.tar"'
    with tarfile.open(fileobj=io.BytesIO(whole.content), mode="r:") as tar:
        tar.extractall(tmp_path / "x", filter="data")
    folder = tmp_path / "x" / f"liar-job-{job_id}"
    for f in listing["files"]:
        assert hashlib.sha256((folder / f["name"]).read_bytes()).hexdigest() == f["sha256"]
    from core import load_pruned

    model, _ = load_pruned(folder)
    assert sum(p.numel() for p in model.parameters()) == service.show(job_id)["metrics"]["params_after"]


def test_downloads_stay_inside_the_job_folder(finished, tmp_path):
    service, job_id, http = finished
    (service.settings.data_dir / "secret.txt").write_text("not yours")
    for url in (
        f"/jobs/{job_id}/files/..%2F..%2Fsecret.txt",
        f"/jobs/{job_id}/files/%2E%2E/%2E%2E/secret.txt",
        f"/jobs/{job_id}/files/%2Fetc%2Fpasswd",
    ):
        got = http.get(url)
        assert got.status_code == 400 and "is not a file name inside a checkpoint" in got.text, url
    got = http.get(f"/jobs/{job_id}/files/../../secret.txt")  # the client resolves the dots itself
    assert got.status_code == 404 and "not yours" not in got.text
    assert http.get(f"/jobs/{job_id}/files/nope.bin").status_code == 404
    assert http.get("/jobs/999/checkpoint.tar").status_code == 404
    assert http.get("/jobs/999/files/config.json").status_code == 404
    with service.sessions.begin() as s:  # a recorded path outside the folder (a tampered row)
        s.execute(
            update(Artifact)
            .where(Artifact.job_id == job_id, Artifact.name == "config.json")
            .values(path=str(service.settings.data_dir / "secret.txt"))
        )
    for url in (f"/jobs/{job_id}/files/config.json", f"/jobs/{job_id}/checkpoint.tar"):
        got = http.get(url)
        assert got.status_code == 403 and "not yours" not in got.text, url


def test_an_older_job_offers_its_archive(job_service, llama_dir):
    job_id = job_service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2"}})
    folder = job_service.settings.artifacts_dir / f"job-{job_id}"
    folder.mkdir(parents=True)
    archive = folder / f"liar-job-{job_id}.tar.gz"
    archive.write_bytes(b"old")
    with job_service.sessions.begin() as s:
        s.add(Artifact(job_id=job_id, kind="checkpoint", path=f"artifacts/job-{job_id}/checkpoint", size=3))
        key = f"artifacts/job-{job_id}/{archive.name}"  # revision 0006: keys in the store
        s.add(Artifact(job_id=job_id, kind="archive", path=key, size=3, sha256="ab" * 32))
        s.execute(update(Job).where(Job.id == job_id).values(status="SUCCEEDED"))
    app = FastAPI()
    app.include_router(downloads.router(job_service))
    http = TestClient(app)
    got = http.get(f"/jobs/{job_id}/checkpoint.tar")
    assert got.status_code == 200 and got.content == b"old" and got.history[0].status_code == 307
    listing = listings.download_listing(job_service, job_id)
    assert listing["checkpoint_tar"] == f"jobs/{job_id}/files/{archive.name}"
    page = views.model_page(job_service, job_id).downloads
    assert f"[⬇ Whole checkpoint as one file — {archive.name}](jobs/{job_id}/files/{archive.name})" in page
    assert "`" + "ab" * 32 + "`" in page


def test_the_model_page_and_the_jobs_tab_show_files_and_timings(finished):
    service, job_id, _ = finished
    head, _, report, layers, links, load = views.model_page(service, job_id)
    info = service.show(job_id)
    assert f"(jobs/{job_id}/checkpoint.tar)" in links
    for a in info["artifacts"][1:]:
        assert f"| [{a['name']}](jobs/{job_id}/files/{a['name']}) | " in links and f"`{a['sha256']}`" in links
    assert "#### Where the time went" in head and "| reconstruct | " in head
    assert "&nbsp;&nbsp;&nbsp;layer 2/2 |" in head and "| **total** |" in head
    assert head.count("| parameters, pruned |") == 1 and "| layer | module |" not in head  # each table once
    assert len(report) == len(info["report"]) and layers["data"]["values"][0]["projection"] == "0 attn"
    # the folder the downloaded tar unpacks to, never the server's folder
    assert f'from_pretrained("liar-job-{job_id}"' in load and "AutoTokenizer.from_pretrained" in load
    assert f"tar xf liar-job-{job_id}.tar" in load and str(service.settings.data_dir) not in load
    assert all("path" not in a for a in info["artifacts"])  # users see names, sizes and hashes only
    tab = views.job_panel(service, job_id)[2]
    assert "| load | " in tab and "layer 1/2" not in tab  # per stage only
    assert views.job_panel(service, 999)[2] == "" and views.job_panel(service, None)[2] == ""


def test_sizes_read_as_a_download_bar_counts():
    assert listings.size_text(999) == "999 B" and listings.size_text(1500) == "1.5 kB"
    assert listings.size_text(9_600_000_000) == "9.6 GB" and listings.size_text(None) == "–"
    assert listings.timings_markdown(None) == ""


def test_the_model_page_offers_the_serving_files(job_service, corpus, tmp_path_factory):
    """A job whose recipe asks for a GGUF: the model page lists it (size, how to run it) above the
    checkpoint's files, and it downloads like any of them."""
    from core.models.tiny import tiny_decoder

    model = tiny_decoder(tmp_path_factory.mktemp("serving") / "llama-bpe", tokenizer="bpe")
    calibration = {"texts": corpus, "num_calibration_samples": 8, "max_seq_length": 24}
    job_id = job_service.submit({"model": str(model), "ratio": 0.3, "calibration": calibration, "export": ["gguf-f16"]})
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    gguf = next(f for f in job_service.downloads(job_id) if f["name"].endswith("-f16.gguf"))
    links = views.model_page(job_service, job_id).downloads
    serving, files = links.split("### Download")
    row = f"- [{gguf['name']}](jobs/{job_id}/files/{gguf['name']}) — {listings.size_text(gguf['size'])}"
    assert serving.startswith("### Serving files") and row in serving and f"`llama-cli -m {gguf['name']}`" in serving
    assert f"| [{gguf['name']}](jobs/{job_id}/files/{gguf['name']}) |" in files  # and among the checkpoint's files
    app = FastAPI()
    app.include_router(downloads.router(job_service))
    got = TestClient(app).get(f"/jobs/{job_id}/files/{gguf['name']}")
    assert got.status_code == 200 and got.content[:4] == b"GGUF" and len(got.content) == gguf["size"]
