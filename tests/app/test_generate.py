"""The prompt box's two halves in-process (``jobs.generation``): what a worker answers for a finished
job (greedy text from the pruned checkpoint and its dense model, each with its speed), what the web
side refuses before anything is sent, and its one sentence when no worker answers. The whole path
through the app's API, with a worker and logins, is ``test_generate_api``."""

from __future__ import annotations

import pytest

from app.web import try_model
from jobs import generation
from jobs.access import Actor, Forbidden
from jobs.service import JobService, SubmitError
from jobs.tasks import execute

OWNER, OTHER = Actor("bob"), Actor("carol")


@pytest.fixture()
def finished(job_service, llama_dir, corpus):
    calibration = {"texts": corpus, "num_calibration_samples": 8, "max_seq_length": 24}
    job_id = job_service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": calibration}, "bob")
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    return job_id


def test_the_worker_answers_both_sides_greedily(job_service, finished):
    answer = generation.answer(job_service.settings, finished, "the model keeps", 6)
    assert answer["job"] == finished and answer["max_new_tokens"] == 6 and answer["worker"]
    for side in ("pruned", "dense"):
        got = answer[side]
        assert "error" not in got, got
        assert 1 <= got["tokens"] <= 6 and got["tokens_per_s"] > 0 and isinstance(got["text"], str)
    again = generation.answer(job_service.settings, finished, "the model keeps", 6)
    assert [again[s]["text"] for s in ("pruned", "dense")] == [answer[s]["text"] for s in ("pruned", "dense")]
    line = try_model.speed_line(answer)
    assert "tokens/s" in line and "the dense speed" in line


def test_the_worker_refuses_what_the_web_side_would(job_service, finished):
    assert generation.answer(job_service.settings, finished, "", 6) == {
        "error": "the prompt is empty: type a few words for both models to continue"
    }
    assert generation.answer(job_service.settings, 999, "x", 6) == {
        "error": "job 999 has no finished checkpoint any more"
    }


@pytest.mark.parametrize(
    ("prompt", "tokens", "said"),
    [
        ("", 8, "the prompt is empty: type a few words for both models to continue"),
        ("   ", 8, "the prompt is empty"),
        ("x" * 4001, 8, "the prompt has 4,001 characters; at most 4,000 are allowed"),
        ("hello", 0, "tokens: a whole number from 1 to 256, not 0"),
        ("hello", 257, "tokens: a whole number from 1 to 256, not 257"),
        ("hello", 2.5, "tokens: a whole number from 1 to 256, not 2.5"),
        ("hello", "many", "tokens: a whole number from 1 to 256, not 'many'"),
        ("hello", True, "tokens: a whole number from 1 to 256, not True"),
    ],
)
def test_bad_prompts_and_token_counts_are_one_sentence(job_service, prompt, tokens, said):
    with pytest.raises(SubmitError) as refused:
        generation.request(job_service, 1, prompt, tokens, wait=1)
    assert str(refused.value).startswith(said)
    assert try_model.try_it(job_service, 1, prompt, tokens, wait=1)[2].message.startswith(said)


def test_only_a_finished_checkpoint_and_only_for_who_may_download_it(job_service, finished, llama_dir, corpus):
    queued = job_service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"texts": corpus}}, "bob")
    with pytest.raises(ValueError, match=f"job {queued} is QUEUED: only a finished job's checkpoint can generate"):
        generation.request(job_service, queued, "hello", 8, wait=1)
    with pytest.raises(KeyError, match="no job 999"):
        generation.request(job_service, 999, "hello", 8, wait=1)
    owners = JobService(job_service.settings.__class__(**{**job_service.settings.__dict__, "downloads": "owners"}))
    with pytest.raises(Forbidden, match=f"job {finished} is bob's: only its owner or an administrator may generate"):
        generation.request(owners, finished, "hello", 8, OTHER, wait=1)


def test_no_worker_is_one_sentence_after_a_bounded_wait(job_service, finished):
    with pytest.raises(generation.NoAnswer) as refused:
        generation.request(job_service, finished, "hello", 8, OWNER, wait=1)
    assert str(refused.value) == (
        "no worker on the job's queue answered within 1 s (they run one task at a time, so they may be busy "
        "with jobs, or none is running): try again later"
    )
    pruned, dense, line = try_model.try_it(job_service, finished, "hello", 8, OWNER, wait=1)
    assert (pruned, dense) == ("", "") and line.message.startswith("no worker on the job's queue answered")


def test_an_encoder_is_refused_before_anything_is_sent(job_service, bert_dir, corpus):
    calibration = {"texts": corpus, "num_calibration_samples": 8, "max_seq_length": 24}
    job_id = job_service.submit({"model": str(bert_dir), "ratio": 0.3, "calibration": calibration}, "bob")
    assert execute(job_id, job_service.settings) == "SUCCEEDED", job_service.show(job_id)["error"]
    with pytest.raises(ValueError) as refused:
        generation.request(job_service, job_id, "hello", 8, wait=1)
    assert str(refused.value) == f"job {job_id}'s model is an encoder: only a causal language model continues a prompt"
