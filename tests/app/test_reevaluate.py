"""Re-running a job's evaluations from the Jobs tab and from ``liar jobs reevaluate`` at the database
(``jobs.reevaluation``; through the API and ``--server``: ``test_team``)."""

from __future__ import annotations

import json

from app.cli import main
from app.web import views
from jobs.access import Actor
from tests.jobs.test_reevaluation import seed_failed_evaluation

ADMIN, OWNER, OTHER = Actor("alice", admin=True), Actor("bob"), Actor("carol")


def _held(tmp_path):
    held = tmp_path / "held-out.txt"
    held.write_text("the quick brown fox jumps over the lazy dog. " * 200)
    return held


def test_the_jobs_tab_offers_it_for_a_job_whose_evaluations_failed(job_service, llama_dir, tmp_path):
    """Re-evaluate is usable only on a succeeded pruning job with failed evaluations; a click queues
    a re-evaluation of the clicking account, or says in one sentence why not."""
    job_id = seed_failed_evaluation(job_service, llama_dir, _held(tmp_path))
    queued = job_service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2"}}, "bob")
    assert views.actions_enabled(job_service, job_id) == (False, True, True)
    assert views.actions_enabled(job_service, queued) == (True, False, False)
    assert views.actions_enabled(job_service, None) == views.NO_BUTTONS == (False, False, False)
    assert views.reevaluate_job(job_service, job_id, OTHER) == (
        f"**⚠ job {job_id} is bob's: only its owner or an administrator may re-evaluate it**"
    )
    assert views.reevaluate_job(job_service, queued, OWNER).startswith(f"**⚠ job {queued} is QUEUED: only a")
    assert views.reevaluate_job(job_service, None, OWNER) == f"**⚠ {views.NOTHING_PICKED}**"
    said = views.reevaluate_job(job_service, job_id, ADMIN)
    new = int(said.split("as job ")[1].split()[0])
    assert said == f"job {job_id}: its evaluations run again on its checkpoint as job {new} (nothing is pruned)"
    info = job_service.show(new)
    assert info["submitted_by"] == "alice" and info["source_job"] == job_id
    assert f"**Re-evaluation** of job {job_id}" in views.job_panel(job_service, new)[0]
    assert views.actions_enabled(job_service, new) == (True, False, False)  # not itself re-evaluated
    assert views.reevaluate_job(job_service, job_id, OWNER) == (
        f"**⚠ job {job_id} is already being re-evaluated by job {new}: wait for it, or cancel it**"
    )


def test_gradio_fills_the_request_of_the_re_evaluate_handler(job_service):
    """With login on, the re-evaluation is the clicking account's: Gradio must pass gr.Request."""
    import gradio as gr
    from gradio import helpers

    from app.web import build_app

    demo = build_app(job_service, default_models=[], default_texts=[], eval_texts=[])
    (handler,) = [fn for fn in demo.fns.values() if fn.fn is not None and fn.fn.__name__ == "reevaluate"]
    request = gr.Request(username="ada")
    filled, *_ = helpers.special_args(handler.fn, inputs=[None] * len(handler.inputs), request=request)
    assert filled[-1] is request


def test_the_command_at_the_database(tmp_path, llama_dir, monkeypatch, capsys):
    """``liar jobs reevaluate N``: the operator's; a refusal is one line and exit 2, no traceback."""
    from jobs.service import JobService

    monkeypatch.setenv("LIAR_DATA_DIR", str(tmp_path / "data"))
    for k in ("LIAR_DATABASE_URL", "LIAR_BROKER_URL", "LIAR_SERVER"):
        monkeypatch.delenv(k, raising=False)
    service = JobService()
    job_id = seed_failed_evaluation(service, llama_dir, _held(tmp_path))
    for argv, message in (
        (["jobs", "reevaluate", "999"], "no job 999"),
        (
            ["jobs", "reevaluate", str(job_id), "--evaluations", "2"],
            "the job has 1 evaluation: there is no evaluation 2",
        ),
    ):
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
    assert main(["jobs", "reevaluate", str(job_id), "--evaluations", "all"]) == 0
    out = capsys.readouterr().out.strip()
    assert out.startswith(f"job {job_id}: evaluations run again on its checkpoint as job ")
    new = int(out.split("as job ")[1].split()[0])
    assert main(["jobs", "show", str(new)]) == 0
    assert f"re-evaluates: job {job_id}" in capsys.readouterr().out
    assert main(["jobs", "reevaluate", str(job_id)]) == 2
    assert f"already being re-evaluated by job {new}" in capsys.readouterr().err
    assert main(["jobs", "show", str(job_id), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["status"] == "SUCCEEDED"
