"""Export after the fact (``jobs.export_jobs``): a finished job's checkpoint written in a serving form by
an export-only job of its own, run in-process on tiny models; the forms a checkpoint cannot take are
refused before anything runs, in the exporter's own sentence; the files are listed and served like a
checkpoint's, with their sha256; and the Model page offers only the possible forms."""

from __future__ import annotations

import hashlib
import json

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from sqlalchemy import func, select

from app.web import charts, downloads, exports_panel, listings, views
from core.models.tiny import tiny_decoder
from jobs import export_jobs
from jobs.access import Actor, Forbidden
from jobs.db import Job
from jobs.service import SubmitError
from jobs.tasks import execute

ADMIN, OWNER, OTHER = Actor("alice", admin=True), Actor("bob"), Actor("carol")


@pytest.fixture(scope="module")
def bpe_dir(tmp_path_factory):
    """A tiny LLaMA with a byte-level BPE tokenizer: the kind GGUF's vocabulary can state."""
    return tiny_decoder(tmp_path_factory.mktemp("bpe-model") / "tiny-bpe", tokenizer="bpe")


@pytest.fixture(scope="module")
def deep_dir(tmp_path_factory):
    """A 4-layer tiny LLaMA: pruned with a global allocation, its layers keep different head counts."""
    return tiny_decoder(tmp_path_factory.mktemp("deep-model") / "tiny-deep", num_hidden_layers=4)


def _finished(service, model, corpus, owner: str = "bob", **recipe) -> int:
    calibration = {"texts": corpus, "num_calibration_samples": 8, "max_seq_length": 24}
    job_id = service.submit({"model": str(model), "ratio": 0.3, "calibration": calibration, **recipe}, owner)
    assert execute(job_id, service.settings) == "SUCCEEDED", service.show(job_id)["error"]
    return job_id


def _count(service) -> int:
    with service.sessions() as s:
        return s.scalar(select(func.count(Job.id)))


def test_a_wordlevel_tokenizer_has_no_gguf_form_and_nothing_is_queued(job_service, llama_dir, corpus):
    source = _finished(job_service, llama_dir, corpus)
    forms = {c.form: c for c in export_jobs.choices(job_service, source)}
    for form in ("gguf-f16", "gguf-q8_0", "gguf-q4_k_m"):
        assert not forms[form].offered
        assert "it is WordLevel, and GGUF export writes BPE tokenizers" in forms[form].problem
    before = _count(job_service)
    with pytest.raises(SubmitError) as refused:
        export_jobs.submit(job_service, source, ["gguf-f16"], OWNER)
    said = str(refused.value)
    assert said.startswith(f"gguf-f16 cannot be written from job {source}'s checkpoint: cannot write the tokenizer")
    assert "/" not in said.split("(")[0] and "\n" not in said  # one sentence, no server path
    assert _count(job_service) == before


def test_non_uniform_query_heads_have_no_vllm_form(job_service, deep_dir, corpus):
    magnitude = {"criterion": {"name": "magnitude"}, "reconstruction": {"method": "liar", "select": "criterion"}}
    source = _finished(job_service, deep_dir, corpus, ratio=0.5, allocation="global", **magnitude)
    vllm = next(c for c in export_jobs.choices(job_service, source) if c.form == "vllm")
    layout = json.loads(job_service.artifact(source).joinpath("config.json").read_text())["liar_layout"]
    if len({len(e["heads"]) for e in layout}) == 1:
        pytest.fail("the test needs a checkpoint whose layers keep different numbers of query heads")
    assert "vLLM's DeciLM states one query-head count for every layer" in vllm.problem
    with pytest.raises(SubmitError, match="vllm cannot be written"):
        export_jobs.submit(job_service, source, "vllm", OWNER)


def test_a_vllm_export_job_writes_listed_files_with_their_sha256(job_service, llama_dir, corpus):
    source = _finished(job_service, llama_dir, corpus, query_heads="uniform")
    assert next(c for c in export_jobs.choices(job_service, source) if c.form == "vllm").offered
    job_id = export_jobs.submit(job_service, source, ["vllm"], OWNER)
    assert job_service.show(job_id)["recipe"] == {"model": f"job:{source}", "export_only": True, "export": ["vllm"]}
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    http = TestClient(_routes(job_service))
    files = listings.download_listing(job_service, job_id)["files"]
    names = [f["name"] for f in files]
    assert "vllm/config.json" in names and "README.md" in names and names[-1] == "SHA256SUMS"
    for f in files:
        got = http.get("/" + f["url"])
        assert got.status_code == 200 and hashlib.sha256(got.content).hexdigest() == f["sha256"]
    config = json.loads(http.get(f"/jobs/{job_id}/files/vllm/config.json").content)
    assert config["architectures"] == ["DeciLMForCausalLM"]
    # the source's page lists the export with its files; the form is no longer offered there
    vllm = next(c for c in export_jobs.choices(job_service, source) if c.form == "vllm")
    assert vllm.done_by == job_id and not vllm.offered
    with pytest.raises(SubmitError, match=f"job {job_id} already exports job {source}'s checkpoint as vllm"):
        export_jobs.submit(job_service, source, ["vllm"], OWNER)
    page = exports_panel.markdown(job_service, source)
    assert f"jobs/{job_id}/files/vllm/config.json" in page and files[0]["sha256"] in page
    assert f"jobs/{job_id}/checkpoint.tar" in page
    with pytest.raises(SubmitError, match=f"model job:{job_id}: that job exported job:{source} for serving: name"):
        job_service.submit({"model": f"job:{job_id}", "ratio": 0.3, "calibration": {"texts": corpus}}, "bob")
    # an export is no run: the dashboard leaves it out; the jobs table says what it does
    assert [r["id"] for r in charts.run_rows(job_service)] == [source]
    row = next(r for r in views.job_rows(job_service) if r[0] == job_id)
    assert row[7] == f"job:{source}" and row[8] == "export vllm (no pruning)"


def _routes(service) -> FastAPI:
    app = FastAPI()
    app.include_router(downloads.router(service))
    return app


def test_a_gguf_f16_export_job_on_a_bpe_model(job_service, bpe_dir, corpus):
    import gguf

    source = _finished(job_service, bpe_dir, corpus)
    offered = [c.form for c in export_jobs.choices(job_service, source) if c.offered]
    assert "gguf-f16" in offered
    job_id = export_jobs.submit(job_service, source, ["gguf-f16"], OWNER)
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    (gguf_file,) = [f for f in job_service.downloads(job_id) if f["name"].endswith(".gguf")]
    assert gguf_file["name"] == f"liar-job-{source}-f16.gguf"
    path = job_service.settings.store().path(job_service.served(job_id)[0].key).parent / gguf_file["name"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == gguf_file["sha256"]
    arch = gguf.GGUFReader(path).fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() in ("llama", "deci")
    assert job_service.show(job_id)["metrics"]["export_written"] == 1
    assert "llama-cli -m" in listings.serving_markdown(listings.download_listing(job_service, job_id))


def test_a_q4_k_m_export_job_loads_in_llama_cpp(job_service, bpe_dir, corpus):
    """llama.cpp's own quantizer on the worker (``liar engines install llama.cpp``; missing, this fails,
    as the serving tests do: the form exists for llama.cpp)."""
    from core.serving.engines import call_llama_cpp

    source = _finished(job_service, bpe_dir, corpus)
    job_id = export_jobs.submit(job_service, source, ["gguf-q4_k_m", "gguf-f16"], OWNER)
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    names = [f["name"] for f in job_service.downloads(job_id) if f["name"].endswith(".gguf")]
    assert names == [f"liar-job-{source}-f16.gguf", f"liar-job-{source}-q4_k_m.gguf"]
    folder = job_service.settings.store().path(job_service.served(job_id)[0].key).parent
    info = call_llama_cpp({"op": "info", "model": str(folder / names[1])}, timeout=120)
    assert info["metadata"]["general.architecture"] in ("llama", "deci")
    forms = {c.form: c for c in export_jobs.choices(job_service, source)}
    assert forms["gguf-q4_k_m"].done_by == forms["gguf-f16"].done_by == job_id


def test_a_quantized_form_without_llama_cpp_fails_before_writing(job_service, bpe_dir, corpus, monkeypatch):
    """The web host cannot know a worker's engines: the worker checks before writing, and says why."""
    import core.serving.engines as engines

    source = _finished(job_service, bpe_dir, corpus)
    job_id = export_jobs.submit(job_service, source, ["gguf-q8_0"], OWNER)
    monkeypatch.setattr(engines, "llama_cpp_python", lambda: None)
    assert execute(job_id, job_service.settings) == "FAILED"
    info = job_service.show(job_id)
    assert info["error"].startswith("export gguf-q8_0 refused before anything was written: gguf-q8_0 needs llama.cpp")
    assert info["artifacts"] == [] and not any(job_service.settings.artifacts_dir.glob(f"job-{job_id}/*"))
    again = job_service.rerun(job_id, OWNER)  # a failed export is tried again as a new export job
    assert job_service.show(again)["recipe"]["export"] == ["gguf-q8_0"]


def test_who_may_export_follows_the_download_rule(job_service, llama_dir, corpus):
    source = _finished(job_service, llama_dir, corpus, query_heads="uniform")
    owners = job_service.settings.__class__(**{**job_service.settings.__dict__, "downloads": "owners"})
    from jobs.service import JobService

    strict = JobService(owners)
    with pytest.raises(Forbidden, match=f"job {source} is bob's: only its owner or an administrator may export it"):
        export_jobs.submit(strict, source, ["vllm"], OTHER)
    assert exports_panel.markdown(strict, source, OTHER).startswith("Exports of this checkpoint are for")
    assert export_jobs.submit(strict, source, ["vllm"], ADMIN) > source
    # everyone may where downloads are for everyone
    with pytest.raises(SubmitError, match="already exports"):
        export_jobs.submit(job_service, source, ["vllm"], OTHER)


def test_bad_requests_are_one_sentence(job_service, llama_dir, corpus):
    source = _finished(job_service, llama_dir, corpus)
    with pytest.raises(SubmitError, match="unknown serving form 'onnx': the forms are gguf-f16"):
        export_jobs.submit(job_service, source, ["onnx"], OWNER)
    with pytest.raises(SubmitError, match="name a serving form to export"):
        export_jobs.submit(job_service, source, [], OWNER)
    with pytest.raises(KeyError, match="no job 999"):
        export_jobs.submit(job_service, 999, ["vllm"], OWNER)
    queued = job_service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"texts": corpus}}, "bob")
    with pytest.raises(ValueError, match=f"job {queued} is QUEUED: only a finished job's checkpoint can be exported"):
        export_jobs.submit(job_service, queued, ["vllm"], OWNER)


def test_without_the_weights_here_gguf_is_judged_by_config_and_tokenizer(bpe_dir, llama_dir, tmp_path):
    """A web host of a remote store fetches a checkpoint's small files only: the forms are still said."""
    import shutil

    for model in (bpe_dir, llama_dir):
        small = tmp_path / model.name
        small.mkdir()
        for f in model.iterdir():
            if not f.name.endswith(".safetensors"):
                shutil.copy(f, small / f.name)
        said = export_jobs.problem(small, "gguf-q8_0")
        if model == bpe_dir:
            assert said is None
        else:
            assert said.startswith("cannot write the tokenizer into the GGUF: it is WordLevel")
        assert export_jobs.problem(small, "vllm") is None  # the config alone says
