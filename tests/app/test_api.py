"""The web app's named API endpoints through gradio_client, against `liar app` with its embedded worker."""

from __future__ import annotations

import hashlib
import json
import tarfile

import httpx
import pytest
import yaml

from tests.jobs.conftest import wait_for

pytestmark = pytest.mark.integration  # the running app and its worker


class _Reader:
    """A file-like view of a response's chunks, for tarfile's stream mode."""

    def __init__(self, chunks):
        self.chunks, self.buffer = chunks, b""

    def read(self, n: int = -1) -> bytes:
        while n < 0 or len(self.buffer) < n:
            chunk = next(self.chunks, None)
            if chunk is None:
                break
            self.buffer += chunk
        n = len(self.buffer) if n < 0 else n
        out, self.buffer = self.buffer[:n], self.buffer[n:]
        return out


def test_named_endpoints(app_server, tmp_path):
    from gradio_client import Client

    client = Client(app_server["url"], verbose=False, download_files=str(tmp_path))
    data = app_server["data"]
    recipe = {
        "model": str(data / "models" / "tiny-llama-demo"),
        "ratio": 0.3,
        "calibration": {
            "dataset": str(data / "texts" / "tiny-demo.txt"),
            "num_calibration_samples": 8,
            "max_seq_length": 32,
        },
    }
    # the app server is the session's: other test files in this process may have submitted jobs already
    before = {r["id"] for r in json.loads(client.predict("", api_name="/list_jobs"))}
    job = client.predict(yaml.safe_dump(recipe), "ada", api_name="/submit")
    assert isinstance(job["id"], int)

    with pytest.raises(Exception, match="ratio must lie strictly between 0 and 1"):
        client.predict(yaml.safe_dump({**recipe, "ratio": 1.5}), "ada", api_name="/submit")

    # a perplexity evaluation through the API: the window defaults to the demo model's 256 positions
    held = str(data / "texts" / "tiny-demo-heldout.txt")
    with_ppl = client.predict(yaml.safe_dump(recipe), "ada", held, api_name="/submit")
    shown = json.loads(client.predict(with_ppl["id"], api_name="/show_job"))
    # (the typed path under the data folder is shown by its name: jobs.names)
    assert [(e["dataset"], e["seq_len"]) for e in shown["evaluations"]] == [("texts/tiny-demo-heldout.txt", 256)]
    with pytest.raises(Exception, match="exceeds the model's limit of 256 positions"):
        client.predict(yaml.safe_dump(recipe), "ada", held, 512, api_name="/submit")

    info = wait_for(
        lambda: (
            (i := json.loads(client.predict(job["id"], api_name="/show_job")))["status"] in ("SUCCEEDED", "FAILED")
            and i
        ),
        timeout=180,
        what="the job",
    )
    assert info["status"] == "SUCCEEDED" and info["submitted_by"] == "ada"
    rows = json.loads(client.predict("", api_name="/list_jobs"))
    new = [r["id"] for r in rows if r["id"] not in before]
    assert new == [with_ppl["id"], job["id"]]  # the invalid submissions created nothing

    # the files: listed with their sha256 by /download, fetched over plain HTTP beside the app
    listing = json.loads(client.predict(job["id"], api_name="/download"))
    files = {f["name"]: f for f in listing["files"]}
    assert {"config.json", "SHA256SUMS"} <= set(files) and all(f["kind"] == "file" for f in files.values())
    config = httpx.get(app_server["url"] + files["config.json"]["url"])
    assert config.status_code == 200 and hashlib.sha256(config.content).hexdigest() == files["config.json"]["sha256"]
    with httpx.stream("GET", app_server["url"] + listing["checkpoint_tar"]) as response:
        assert response.status_code == 200 and "content-encoding" not in response.headers
        size = int(response.headers["content-length"])
        with tarfile.open(fileobj=_Reader(response.iter_raw()), mode="r|") as tar:  # as it arrives
            tar.extractall(tmp_path / "x", filter="data")
    folder = tmp_path / "x" / f"liar-job-{job['id']}"
    assert sum(p.stat().st_size for p in folder.rglob("*") if p.is_file()) == sum(f["size"] for f in files.values())
    assert size > sum(f["size"] for f in files.values())
    for name, f in files.items():
        assert hashlib.sha256((folder / name).read_bytes()).hexdigest() == f["sha256"], name
    from core import load_pruned

    model, _ = load_pruned(folder)
    assert sum(p.numel() for p in model.parameters()) == info["metrics"]["params_after"]
    escape = httpx.get(app_server["url"] + f"jobs/{job['id']}/files/..%2F..%2Fliar.db")
    assert escape.status_code == 400 and "SQLite" not in escape.text
    assert info["timings"]["total"] > 0 and info["timings"]["stages"][1]["stage"] == "load"

    assert client.predict(job["id"], api_name="/cancel_job") == "SUCCEEDED"  # finished jobs stay finished
    with pytest.raises(Exception, match="no job 999"):
        client.predict(999, api_name="/show_job")


def test_login_records_the_account_as_submitter(team, app_server):
    """On a server with login on (the team's: ``tests.app.conftest``), a submission is the account's,
    whatever name it gives, and the download routes sit behind the same login."""
    from gradio_client import Client

    from tests.app.conftest import PASSWORDS

    url, data = team["url"], team["data"]
    with pytest.raises(Exception):  # noqa: B017 - no credentials, no access
        Client(url, verbose=False).predict("", api_name="/list_jobs")
    client = Client(url, auth=("bob", PASSWORDS["bob"]), verbose=False)
    outside = {  # another server's files: outside this one's data folders
        "model": str(app_server["data"] / "models" / "tiny-llama-demo"),
        "ratio": 0.3,
        "calibration": {"dataset": str(app_server["data"] / "texts" / "tiny-demo.txt")},
    }
    with pytest.raises(Exception, match="outside the folders this server reads from"):
        client.predict(yaml.safe_dump(outside), "mallory", api_name="/submit")
    recipe = {
        "model": str(data / "models" / "tiny-llama-demo"),
        "ratio": 0.3,
        "calibration": {"dataset": str(data / "texts" / "tiny-demo.txt")},
    }
    job = client.predict(yaml.safe_dump(recipe), "mallory", api_name="/submit")
    info = json.loads(client.predict(job["id"], api_name="/show_job"))
    assert info["submitted_by"] == "bob"
    # the download routes sit behind the same login
    tar = f"jobs/{job['id']}/checkpoint.tar"
    assert httpx.get(url + tar).status_code == 401
    with httpx.Client(base_url=url) as browser:
        assert browser.post("login", data={"username": "bob", "password": PASSWORDS["bob"]}).status_code == 200
        missing = browser.get(tar)  # logged in, the job's owner: the queued job has nothing to download yet
        assert missing.status_code == 404 and "has no checkpoint files" in missing.text
