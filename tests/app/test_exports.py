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
    info = job_service.show(job_id)
    assert info["metrics"]["export_written"] == 1
    assert "llama-cli -m" in listings.serving_markdown(listings.download_listing(job_service, job_id))
    # the source evaluated no perplexity: the file has its size and no score, and the chart says why
    assert info["metrics"]["export.gguf-f16.bytes"] == gguf_file["size"]
    assert "export.gguf-f16.perplexity" not in info["metrics"]
    said = f"the files' held-out perplexity is not measured: job {source} ran no perplexity evaluation"
    assert said in [x["message"] for x in info["log"]]
    _, _, spec, caption = exports_panel.panel(job_service, source)
    assert caption == "" and "layer" not in spec
    assert " ".join(spec["data"]["values"][0]["reason"]) == (
        f"Job {source} names no evaluation text (it ran no perplexity evaluation), so its exports' held-out "
        "perplexity is not measured."
    )


def test_a_q4_k_m_export_job_loads_in_llama_cpp(job_service, bpe_dir, corpus):
    """llama.cpp's own quantizer on the worker (``liar engines install llama.cpp``; missing, this fails,
    as the serving tests do: the form exists for llama.cpp)."""
    from core.serving.engines import call_llama_cpp

    source = _finished(job_service, bpe_dir, corpus)
    job_id = export_jobs.submit(job_service, source, ["gguf-q4_k_m", "gguf-f16"], OWNER)
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    names = [f["name"] for f in job_service.downloads(job_id) if f["name"].endswith(".gguf")]
    # the K-quant weighted by the importance matrix of the source's calibration text, shipped beside it
    assert names == ["imatrix.gguf", f"liar-job-{source}-f16.gguf", f"liar-job-{source}-q4_k_m.gguf"]
    folder = job_service.settings.store().path(job_service.served(job_id)[0].key).parent
    info = call_llama_cpp({"op": "info", "model": str(folder / names[2])}, timeout=120)
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


def _texts(service, corpus) -> tuple[str, str]:
    """A calibration text and an evaluation text in the server's texts folder (named ``texts/…`` in
    the recipe, the checkpoint's recipe.yaml and the stored evaluations)."""
    folder = service.settings.texts_dir
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "cal.txt").write_text("\n\n".join(corpus))
    (folder / "eval.txt").write_text("\n\n".join(reversed(corpus)))
    return str(folder / "cal.txt"), str(folder / "eval.txt")


def _measured_source(service, model, corpus) -> int:
    """A finished job whose recipe names its calibration text as a file and that evaluated perplexity."""
    cal, text = _texts(service, corpus)
    calibration = {"dataset": cal, "num_calibration_samples": 8, "max_seq_length": 24}
    evaluation = {"type": "perplexity", "dataset": text, "seq_len": 16, "max_windows": 6}
    source = service.submit(
        {"model": str(model), "ratio": 0.3, "calibration": calibration}, "bob", evaluations=[evaluation]
    )
    assert execute(source, service.settings) == "SUCCEEDED", service.show(source)["error"]
    return source


def test_an_iq3_xxs_export_job_gathers_its_matrix_once_and_scores_every_file(job_service, bpe_dir, corpus, monkeypatch):
    """The export job writes as a recipe's export does (``core.serving.write_form``): the i-quant weighted
    by the importance matrix of the source's calibration text (a file the recipe names as users do), which
    goes into the export's own folder, not the source's checkpoint; each GGUF file is scored by llama.cpp
    on the source's evaluation windows, f16 there agreeing with the checkpoint's own perplexity."""
    import core.serving
    import core.serving.quantize
    from app.web import export_chart
    from jobs import export_quality as q

    source = _measured_source(job_service, bpe_dir, corpus)
    checkpoint = job_service.artifact(source)
    sums_before = (checkpoint / "SHA256SUMS").read_text()
    job_id = export_jobs.submit(job_service, source, ["gguf-iq3_xxs", "gguf-q4_k_m", "gguf-f16"], OWNER)
    written, gathered = [], []  # the writer a recipe's export uses; the matrix's forward passes
    write_form, collect = core.serving.write_form, core.serving.quantize.collect
    monkeypatch.setattr(core.serving, "write_form", lambda *a, **k: written.append(a[1]) or write_form(*a, **k))
    monkeypatch.setattr(core.serving.quantize, "collect", lambda *a, **k: gathered.append(1) or collect(*a, **k))
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    assert written == ["gguf-iq3_xxs", "gguf-q4_k_m", "gguf-f16"] and len(gathered) == 1
    info = job_service.show(job_id)
    log = [x["message"] for x in info["log"]]
    gathered = [x for x in log if "quantized with an importance matrix from 8 windows of 24 tokens of cal.txt" in x]
    assert [x.split(":")[0] for x in gathered] == ["export gguf-iq3_xxs", "export gguf-q4_k_m"]
    assert any(x.startswith("export gguf-q4_k_m: ") and "(not a multiple of 256) fell back to" in x for x in log)
    assert "held-out perplexity of each GGUF file in llama.cpp on the 6 windows of 16 tokens of texts/eval.txt" in log
    # the matrix is one of the export's files; the source's checkpoint is as it was
    names = {f["name"] for f in job_service.downloads(job_id)}
    assert {"imatrix.gguf", f"liar-job-{source}-iq3_xxs.gguf", f"liar-job-{source}-q4_k_m.gguf"} <= names
    assert not (checkpoint / "imatrix.gguf").exists() and (checkpoint / "SHA256SUMS").read_text() == sums_before
    serving = listings.serving_markdown(listings.download_listing(job_service, job_id))
    assert "the importance matrix · `llama-quantize --imatrix imatrix.gguf`" in serving
    assert "llama-cli -m imatrix.gguf" not in serving
    # a row per form: bytes, perplexity, fallbacks; the reference is the source's own number
    m, own = info["metrics"], job_service.show(source)["metrics"]
    rows = q.form_rows(m)
    sizes = {f["name"]: f["size"] for f in job_service.downloads(job_id)}
    assert set(rows) == {"gguf-iq3_xxs", "gguf-q4_k_m", "gguf-f16"}
    for form, row in rows.items():
        assert row["bytes"] == sizes[f"liar-job-{source}-{form.removeprefix('gguf-')}.gguf"]
        assert row["perplexity"] > 1
    # the tiny model's rows are no multiple of 256: its K/i files fell back somewhere; f16 has no K type
    assert rows["gguf-q4_k_m"]["fallbacks"] > 0 and rows["gguf-iq3_xxs"]["fallbacks"] > 0
    assert "fallbacks" not in rows["gguf-f16"]
    assert m[q.EVAL_WINDOWS] == m[q.EVAL_TOTAL] == 6 and m[q.REFERENCE_PERPLEXITY] == own["perplexity"]
    assert rows["gguf-f16"]["perplexity"] == pytest.approx(own["perplexity"], rel=0.01)  # the same tokens
    # the Model page's chart: a point per form, the checkpoint as the reference
    spec, caption = export_chart.view(job_service, source, export_jobs.listing(job_service, source))
    assert sorted(p["form"] for p in spec["data"]["values"]) == ["gguf-f16", "gguf-iq3_xxs", "gguf-q4_k_m"]
    assert spec["layer"][-2]["data"]["values"][0]["value"] == own["perplexity"]
    assert caption.startswith("Each GGUF export's perplexity in llama.cpp on the job's 6 windows of 16 tokens")
    # ... and the page's handler fills the panel's chart and caption with them
    from app.web import build_app

    demo = build_app(job_service, default_models=[], default_texts=[], eval_texts=[])
    show = next(f for f in demo.fns.values() if f.fn is not None and f.fn.__module__ == exports_panel.__name__)
    shown = show.fn(source)
    assert len(shown) == len(show.outputs) and shown[2] == caption
    assert shown[1]["visible"] is True and '"gguf-iq3_xxs"' in shown[1]["value"].plot
    assert show.outputs[1].postprocess(shown[1]["value"]).plot == shown[1]["value"].plot  # as gr.Plot draws it


def test_a_subset_of_the_windows_is_said_and_its_reference_measured(job_service, bpe_dir, corpus, monkeypatch):
    import core.serving.quality as quality
    from jobs import export_quality as q

    source = _measured_source(job_service, bpe_dir, corpus)
    monkeypatch.setattr(quality, "EVAL_TOKENS", 64)  # 4 windows of 16 tokens of the evaluation's 6
    job_id = export_jobs.submit(job_service, source, ["gguf-f16"], OWNER)
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    info = job_service.show(job_id)
    log = " | ".join(x["message"] for x in info["log"])
    assert "on the first 4 of the 6 windows of 16 tokens of texts/eval.txt (at most 64 tokens a file" in log
    assert f"job {source}'s checkpoint on those windows: perplexity" in log
    m = info["metrics"]
    assert (m[q.EVAL_WINDOWS], m[q.EVAL_TOTAL]) == (4, 6)
    assert m[q.REFERENCE_PERPLEXITY] != job_service.show(source)["metrics"]["perplexity"]
    assert m["export.gguf-f16.perplexity"] == pytest.approx(m[q.REFERENCE_PERPLEXITY], rel=0.01)


def test_an_i_quant_export_is_refused_where_the_calibration_text_is_gone(job_service, bpe_dir, corpus):
    source = _measured_source(job_service, bpe_dir, corpus)
    (job_service.settings.texts_dir / "cal.txt").unlink()
    job_id = export_jobs.submit(job_service, source, ["gguf-f16", "gguf-iq2_m"], OWNER)
    assert execute(job_id, job_service.settings) == "FAILED"
    error = job_service.show(job_id)["error"]
    assert error.startswith(
        f"export gguf-iq2_m refused before anything was written: it needs an importance matrix, gathered over "
        f"job {source}'s calibration text, and the calibration text 'texts/cal.txt' is not a file on this machine"
    ), error
    assert "\n" not in error and "Traceback" not in error and "/" not in error.replace("texts/cal.txt", "")
    assert job_service.show(job_id)["artifacts"] == []


def test_a_recipes_own_i_quant_is_weighted_over_its_calibration_file(job_service, bpe_dir, corpus):
    """A recipe's ``export`` writes into the checkpoint with the same writer; the checkpoint's recipe.yaml
    names the calibration file as users do (``texts/cal.txt``), so the worker gathers over the file it
    resolved, not over that name."""
    cal, _ = _texts(job_service, corpus)
    calibration = {"dataset": cal, "num_calibration_samples": 8, "max_seq_length": 24}
    recipe = {"model": str(bpe_dir), "ratio": 0.3, "calibration": calibration, "export": ["gguf-iq2_m"]}
    job_id = job_service.submit(recipe, "bob")
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    info = job_service.show(job_id)
    assert info["metrics"]["export_written"] == 1, [x["message"] for x in info["log"]]
    assert "calibration:\n  dataset: texts/cal.txt" in (job_service.artifact(job_id) / "recipe.yaml").read_text()
    said = "quantized with an importance matrix from 8 windows of 24 tokens of cal.txt"
    assert any(x["message"].startswith("export gguf-iq2_m: ") and said in x["message"] for x in info["log"])
    names = {f["name"] for f in job_service.downloads(job_id)}
    assert {"imatrix.gguf", "checkpoint-iq2_m.gguf"} <= names
