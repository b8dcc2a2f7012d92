"""`liar jobs list` with a speed-target job (it has no ratio), and the operator's view of tombstones:
`liar jobs list --deleted` and `liar jobs show N` of a deleted job."""

from __future__ import annotations

import json

import pytest

from app.cli import main
from jobs.db import Job, Metric, Status


@pytest.fixture()
def operator(tmp_path, monkeypatch):
    """The `liar jobs` command at an embedded database, and its service."""
    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL", "LIAR_SERVER"):
        monkeypatch.delenv(k, raising=False)
    from jobs.service import JobService

    return JobService()


def _job(service, **recipe) -> int:
    with service.sessions.begin() as s:
        job = Job(recipe={"model": "models/tiny", **recipe}, evaluations=[], status=Status.SUCCEEDED.value)
        job.submitted_by = "carol"
        s.add(job)
        s.flush()
        s.add(Metric(job_id=job.id, name="perplexity", value=41.5))
        return job.id


def test_list_shows_a_speed_target_in_the_ratio_column(operator, capsys):
    target = _job(operator, target={"speedup": 1.5, "workload": "decode_b1"}, reconstruction={"method": "liar"})
    plain = _job(operator, ratio=0.3)
    assert main(["jobs", "list"]) == 0
    out = capsys.readouterr()
    assert "Traceback" not in out.err
    lines = {int(line.split()[0]): line for line in out.out.splitlines()[1:]}
    assert "1.5×" in lines[target] and " 0.3 " in lines[plain]
    assert main(["jobs", "show", str(target)]) == 0
    assert "target: 1.5× (decode_b1)" in capsys.readouterr().out


def test_the_operator_lists_and_shows_tombstones(operator, capsys):
    from jobs.access import Actor

    kept, gone = _job(operator, ratio=0.3), _job(operator, ratio=0.5)
    operator.delete(gone, Actor("carol"))
    assert main(["jobs", "list"]) == 0
    listed = [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]]
    assert listed == [str(kept)]
    assert main(["jobs", "list", "--deleted"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert "deleted by" in out[0] and len(out) == 2
    assert out[1].split()[0] == str(gone) and "carol" in out[1]
    assert main(["jobs", "list", "--deleted", "--json"]) == 0
    (row,) = json.loads(capsys.readouterr().out)
    assert row["status"] == "DELETED" and row["deleted_by"] == "carol"
    assert main(["jobs", "show", str(gone)]) == 0  # the operator sees the record, metrics included
    shown = capsys.readouterr().out
    assert "status: DELETED" in shown and "by carol" in shown and "perplexity = 41.5" in shown
    assert main(["jobs", "rerun", str(gone)]) == 2
    assert f"job {gone} was deleted by carol on " in capsys.readouterr().err
    assert main(["jobs", "list", "--deleted", "--server", "http://127.0.0.1:9"]) == 2
    assert "without --server" in capsys.readouterr().err
