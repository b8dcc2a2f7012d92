"""The server's models and texts by name, not by path (``jobs.names``): a submission naming
``models/NAME`` and ``texts/NAME`` runs, is stored and shown so, and its checkpoint's files name them
so too while still loading with ``from_pretrained``; a path typed under the data folder comes back as
its name; the operator's view keeps the paths."""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import pytest
import yaml

from core.models.manifest import read_manifest
from jobs.submission import SubmitError
from jobs.tasks import execute


def server_prefixes(data: Path, base: Path | None = None) -> set[str]:
    """What no answer may contain: the data folder's absolute path, and the temporary or home folder it
    lies under (``base``: pytest's base temp folder, or the home folder)."""
    prefixes = {str(data), str(data.resolve())}
    home = Path.home()
    if base is None and (home == data or home in data.parents):
        base = home
    if base is not None:
        prefixes |= {str(base), str(base.resolve())}
    return prefixes


def leaks(content: bytes | str, prefixes: set[str]) -> list[str]:
    """The ``prefixes`` that ``content`` contains (JSON-escaped slashes counted too)."""
    text = content.decode("utf-8", "replace") if isinstance(content, bytes) else content
    text = text.replace("\\/", "/")
    return sorted(p for p in prefixes if p in text)


@pytest.fixture()
def named(job_service, llama_dir, corpus):
    """The service's data folder with a model and two texts in its models/ and texts/ folders."""
    data = job_service.settings.data_dir
    shutil.copytree(llama_dir, data / "models" / "tiny")
    (data / "texts").mkdir(parents=True)
    (data / "texts" / "cal.txt").write_text("\n\n".join(corpus))
    (data / "texts" / "held.txt").write_text("\n\n".join(reversed(corpus)))
    return job_service


def _recipe(model: str = "models/tiny", dataset: str = "texts/cal.txt") -> dict:
    calibration = {"dataset": dataset, "num_calibration_samples": 8, "max_seq_length": 24}
    return {"model": model, "ratio": 0.3, "calibration": calibration}


EVALUATION = [{"type": "perplexity", "dataset": "texts/held.txt", "seq_len": 24, "max_windows": 2}]


def test_a_job_named_by_the_model_list_runs_and_every_file_names_it_so(named, tmp_path):
    service = named
    data = service.settings.data_dir
    job_id = service.submit(_recipe(), "alice", evaluations=EVALUATION, confine=True)
    assert execute(job_id, service.settings) == "SUCCEEDED", service.show(job_id)["error"]
    shown = service.show(job_id)
    assert shown["model"] == shown["recipe"]["model"] == "models/tiny"
    assert shown["recipe"]["calibration"]["dataset"] == "texts/cal.txt"
    assert shown["evaluations"][0]["dataset"] == "texts/held.txt" and "perplexity" in shown["metrics"]
    assert not leaks(json.dumps(shown), server_prefixes(data)), shown
    assert not leaks(json.dumps(service.list()), server_prefixes(data))
    # the operator's view (liar jobs show) keeps where the files are
    internal = service.show(job_id, internal=True)
    assert any(str(data) in str(a.get("path")) for a in internal["artifacts"])

    folder = next(Path(a["path"]) for a in internal["artifacts"] if a["kind"] == "checkpoint")
    for f in folder.rglob("*"):
        if f.is_file():
            assert not leaks(f.read_bytes(), server_prefixes(data)), f.name
    config = json.loads((folder / "config.json").read_text())
    assert config["_name_or_path"] == "models/tiny"
    assert "base_model: models/tiny\n" in (folder / "README.md").read_text()
    assert yaml.safe_load((folder / "recipe.yaml").read_text())["calibration"]["dataset"] == "texts/cal.txt"
    assert json.loads((folder / "metrics.json").read_text())["model"] == "models/tiny"
    for entry in read_manifest(folder):  # the rewritten files' sums were written again
        assert hashlib.sha256((folder / entry.name).read_bytes()).hexdigest() == entry.sha256, entry.name
    from transformers import AutoModelForCausalLM

    copy = shutil.copytree(folder, tmp_path / "downloaded")
    model = AutoModelForCausalLM.from_pretrained(copy, trust_remote_code=True)
    assert sum(p.numel() for p in model.parameters()) == shown["metrics"]["params_after"]


def test_a_typed_path_under_the_data_folder_is_stored_and_shown_by_its_name(named):
    service = named
    data = service.settings.data_dir
    typed = _recipe(str(data / "models" / "tiny"), str(data / "texts" / "cal.txt"))
    evaluations = [{**EVALUATION[0], "dataset": str(data / "texts" / "held.txt")}]
    stored, evals = service.validate(typed, evaluations, confine=True)
    assert stored["model"] == "models/tiny" and stored["calibration"]["dataset"] == "texts/cal.txt"
    assert evals[0]["dataset"] == "texts/held.txt"
    job_id = service.submit(typed, "alice", evaluations=evaluations, confine=True)
    assert service.show(job_id)["recipe"]["model"] == "models/tiny"
    # a re-run of a job stored with its names is checked against the same files
    again = service.rerun(job_id)
    assert service.show(again)["recipe"] == service.show(job_id)["recipe"]


def test_a_sweep_named_by_the_model_list_submits_every_cell(named):
    """The grid's cells are validated on the files the names stand for, and stored by the names."""
    group, ids = named.submit_sweep(_recipe(), ratios=[0.2, 0.3], evaluations=EVALUATION, confine=True)
    assert len(ids) == 2 and group
    for job_id in ids:
        recipe = named.show(job_id)["recipe"]
        assert recipe["model"] == "models/tiny" and recipe["calibration"]["dataset"] == "texts/cal.txt"


def test_a_refusal_names_the_servers_files_by_their_names(named):
    service = named
    data = service.settings.data_dir
    with pytest.raises(SubmitError) as caught:
        service.validate(_recipe(dataset="texts/nope.txt"), confine=True)
    message = str(caught.value)
    assert "texts/nope.txt" in message and not leaks(message, server_prefixes(data)), message
    with pytest.raises(SubmitError) as caught:  # typed as a path: said back by its name
        service.validate(_recipe(dataset=str(data / "texts" / "nope.txt")), confine=True)
    assert not leaks(str(caught.value), server_prefixes(data)), str(caught.value)
    # a hub-like id that is no folder here is left to the Hub's checks, not taken for a path
    assert service.names.path("models/no-such-model") == "models/no-such-model"
    assert service.names.path("models/../liar.db") == "models/../liar.db"


def test_names_of_the_data_folders_files_and_jobs(named):
    names = named.names
    data = named.settings.data_dir
    assert names.name(str(data / "models" / "tiny")) == "models/tiny"
    assert names.name(str(data / "uploads" / "4ae1.jsonl")) == "upload:4ae1.jsonl"
    assert names.name("Qwen/Qwen3-0.6B") == "Qwen/Qwen3-0.6B" and names.name("job:3") == "job:3"
    text = f"could not read {data}/artifacts/job-7/attempt-2/checkpoint/model.safetensors"
    assert names.text(text) == "could not read job:7/model.safetensors"
    assert names.path("models/tiny") == str(data / "models" / "tiny")
    assert names.path("texts/held.txt") == str(data / "texts" / "held.txt")


# --- the scanner: a team's server, its every answer, page and downloaded file ----------------------


def _scan(found: dict, what: str, content: bytes | str, prefixes: set[str]) -> None:
    """Record in ``found`` what ``content`` (an answer, a page, a file) leaks, under ``what``."""
    if leaked := leaks(content, prefixes):
        found[what] = leaked


PAGES = ("", "config", "gradio_api/info", "healthz", "login", "openapi.json", "gradio_api/app_id")


def test_no_server_path_in_any_answer_page_or_downloaded_file(team, tmp_path_factory):
    """Every named API answer (a submission by the model list's names and by a typed path, its
    refusal, the job list, the job, its downloads), every downloaded file and the whole checkpoint
    as a tar, and every page, logged in and not: none names the data folder or the temporary folder
    it lies under."""
    import httpx

    from tests.app.test_team import _browser, _client

    url, data, service = team["url"], team["data"], team["service"]
    prefixes = server_prefixes(data, tmp_path_factory.getbasetemp())
    found: dict[str, list[str]] = {}
    for page in PAGES:  # nobody logged in: the login page and its refusals
        _scan(found, f"logged out: /{page}", httpx.get(url + page).content, prefixes)
    with _browser(url, "alice") as browser:  # the pages before any job: the New-run boxes' defaults
        for page in PAGES:
            _scan(found, f"alice: /{page}", browser.get(page).content, prefixes)
    alice = _client(url, "alice")
    texts = sorted(p.name for p in (data / "texts").glob("*.txt"))
    model = f"models/{team['model'].name}"
    recipe = yaml.safe_dump(_recipe(model, f"texts/{texts[0]}"))
    answer = alice.predict(recipe, "", f"texts/{texts[-1]}", 32, api_name="/submit")
    _scan(found, "/submit by names", json.dumps(answer), prefixes)
    job_id = answer["id"]
    typed = recipe.replace(model, str(team["model"]))
    typed_id = alice.predict(typed, api_name="/submit")["id"]
    shown = json.loads(alice.predict(typed_id, api_name="/show_job"))
    assert shown["recipe"]["model"] == model  # a typed path under the data folder, shown by its name
    _scan(found, "/show_job of a typed path", json.dumps(shown), prefixes)
    with pytest.raises(Exception) as refused:
        alice.predict(recipe.replace(texts[0], "nope.txt"), api_name="/submit")
    _scan(found, "/submit refused", str(refused.value), prefixes)
    assert execute(job_id, service.settings) == "SUCCEEDED", service.show(job_id)["error"]
    shown = json.loads(alice.predict(job_id, api_name="/show_job"))
    assert shown["recipe"]["model"] == model and shown["recipe"]["calibration"]["dataset"] == f"texts/{texts[0]}"
    _scan(found, "/show_job", json.dumps(shown), prefixes)
    ours = [j for j in json.loads(alice.predict(api_name="/list_jobs")) if j["id"] in (job_id, typed_id)]
    _scan(found, "/list_jobs", json.dumps(ours), prefixes)  # (other tests' jobs may name their own folders)
    listing = json.loads(alice.predict(job_id, api_name="/download"))
    _scan(found, "/download", json.dumps(listing), prefixes)
    with _browser(url, "alice") as browser:
        for f in listing["files"]:
            got = browser.get(f["url"])
            assert got.status_code == 200, f["url"]
            _scan(found, f"file {f['name']}", got.content, prefixes)
        got = browser.get(listing["checkpoint_tar"])
        assert got.status_code == 200
        _scan(found, "checkpoint.tar", got.content, prefixes)
        for page in (*PAGES, f"?job={job_id}"):
            _scan(found, f"alice: /{page}", browser.get(page).content, prefixes)
    assert not found, found
