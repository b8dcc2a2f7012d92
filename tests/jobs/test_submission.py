"""What submission refuses that a worker would otherwise fail on after loading (or pruning) the model:
a table of the inputs that used to validate and then fail (``jobs.submission.check_sources``)."""

from __future__ import annotations

import json

import pytest

from jobs.service import JobService, SubmitError
from jobs.settings import Settings
from tests.jobs.conftest import recipe


class _FakeCelery:
    def send_task(self, name, args):
        return type("R", (), {"id": "msg"})()


def _service(tmp_path, offline: bool) -> JobService:
    data = tmp_path / ("offline" if offline else "online")
    url = f"sqlite:///{data / 'j.db'}"
    settings = Settings(data_dir=data, database_url=url, broker_url="memory://", offline=offline)
    return JobService(settings, celery_app=_FakeCelery())


def _jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def test_what_a_worker_would_fail_on_is_refused_at_submission(tmp_path, job_models):
    no_text = _jsonl(tmp_path / "no-text.jsonl", [{"text": "a fine day"}, {"body": "the field is missing"}])
    no_label = _jsonl(tmp_path / "no-label.jsonl", [{"text": "good", "label": 1}, {"text": "bad"}])
    calibration = recipe(job_models)["calibration"]
    ppl = lambda dataset: [{"type": "perplexity", "dataset": dataset, "seq_len": 32}]  # noqa: E731
    cases = [  # (offline, recipe, evaluations, what the refusal says)
        (True, recipe(job_models, model="no-such-org/no-such-model"), [], "not in its Hugging Face cache"),
        (True, recipe(job_models, calibration={**calibration, "dataset": "wikitext2"}), [], "'wikitext2' comes from"),
        (True, recipe(job_models), [{"type": "lm_eval", "tasks": "piqa"}], "task 'piqa' loads its data from the"),
        (True, recipe(job_models), ppl("wikitext2"), "evaluation dataset 'wikitext2' comes from the Hugging Face"),
        (False, recipe(job_models, calibration={**calibration, "dataset": no_text}), [], "2 has no field 'text'"),
        (
            False,
            recipe(job_models, calibration={**calibration, "dataset": no_label, "label_field": "label"}),
            [],
            "record 2 has no label field 'label'",
        ),  # fmt: skip
        (False, recipe(job_models), ppl(str(tmp_path / "gone.txt")), "is neither a named set ('wikitext2'"),
    ]
    for offline, bad, evaluations, expected in cases:
        service = _service(tmp_path, offline)
        with pytest.raises(SubmitError) as refused:
            service.submit(bad, evaluations=evaluations)
        assert expected in str(refused.value), (expected, str(refused.value))
        assert service.list() == []  # nothing was created
    # what offline workers can run is accepted: a local model, a local file, a local task
    from core.evaluation.lmeval import write_rt_sentiment_task

    tasks = tmp_path / "tasks"
    write_rt_sentiment_task(tasks, [{"text": "fine film", "label": 1}])
    service = _service(tmp_path, offline=True)
    local_task = [{"type": "lm_eval", "tasks": "rt_sentiment", "task_dir": str(tasks)}]
    assert service.submit(recipe(job_models), evaluations=local_task) == 1
    assert service.submit(recipe(job_models), evaluations=ppl(str(job_models["calib"]))) == 2
