"""`liar jobs …` verbs on the embedded default (no worker needed to queue, list, show, cancel)."""

from __future__ import annotations

import json

import yaml

from app.cli import main
from tests.jobs.conftest import recipe


def test_jobs_verbs(tmp_path, job_models, monkeypatch, capsys):
    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL"):
        monkeypatch.delenv(k, raising=False)
    good = tmp_path / "good.yaml"
    good.write_text(yaml.safe_dump(recipe(job_models)))
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump(recipe(job_models, ratio=2)))

    assert main(["jobs", "submit", str(bad)]) == 2
    err = capsys.readouterr().err
    assert "invalid recipe: ratio: ratio must lie strictly between 0 and 1" in err
    assert "Traceback" not in err

    assert main(["jobs", "submit", str(good), "--user", "ada", "--json"]) == 0
    job_id = json.loads(capsys.readouterr().out)["id"]
    assert main(["jobs", "list"]) == 0
    out = capsys.readouterr().out
    assert "QUEUED" in out and "ada" in out
    assert main(["jobs", "show", str(job_id), "--json"]) == 0
    info = json.loads(capsys.readouterr().out)
    assert info["status"] == "QUEUED" and info["recipe"]["ratio"] == 0.3
    assert main(["jobs", "cancel", str(job_id)]) == 0
    assert "CANCELLED" in capsys.readouterr().out
    assert main(["jobs", "show", "999"]) == 2
    assert "no job 999" in capsys.readouterr().err
    assert main(["jobs", "submit", str(good), "--sweep-ratios", "0.2", "0.4", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["jobs"]) == 2
