"""The prompt box through the team's API (``/generate``, ``/serving_forms``, ``/export_job``), login on,
downloads for owners: the owner and an admin get both sides' text and tokens/s from a worker of the
job's queue, another user is refused in one sentence, as for a download.

The team's server has no worker of its own (its other tests keep jobs queued): the job here is routed
to a queue of its own, served by a ``liar worker`` started for this module on the team's database and
broker, so no other job of the session is touched."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest
from sqlalchemy import update

from jobs.db import Job
from tests.app.conftest import PASSWORDS
from tests.app.test_access import _finished
from tests.app.test_team import _clean

pytestmark = pytest.mark.integration  # a running app and a worker

QUEUE = "try-model"


def _client(url: str, user: str):
    from gradio_client import Client

    return Client(url, auth=(user, PASSWORDS[user]), verbose=False)


@contextmanager
def queue_worker(data: Path, queue: str = QUEUE) -> Iterator[subprocess.Popen]:
    """A ``liar worker`` on the team's database and broker (under ``data``) serving ``queue`` only."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
    env.update(
        LIAR_DATA_DIR=str(data),
        LIAR_DATABASE_URL=f"sqlite:///{data / 'liar.db'}",
        LIAR_BROKER_URL="filesystem://",
        LIAR_WORKER_MAX_TASKS_PER_CHILD="20",
        PYTHONPATH=str(Path(__file__).resolve().parents[2]),
    )
    with open(data.parent / f"{queue}-worker.log", "a") as log:
        worker = subprocess.Popen(
            [sys.executable, "-m", "app.cli", "worker", "--queues", queue, "--loglevel", "INFO"],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    try:
        yield worker
    finally:
        os.killpg(worker.pid, signal.SIGKILL)
        worker.wait(timeout=30)


def route_to(service, job_id: int, queue: str = QUEUE) -> None:
    """Record ``queue`` as the queue job ``job_id`` ran on (where its prompt box's requests go)."""
    with service.sessions.begin() as s:
        s.execute(update(Job).where(Job.id == job_id).values(queue=queue))


@pytest.fixture(scope="module")
def served_job(team, llama_dir):
    """A job of bob's whose checkpoint (a copy of the tiny model) is on the team's server, routed to
    :data:`QUEUE`, and a worker serving that queue only."""
    job_id = _finished(team["service"], llama_dir, "bob")
    route_to(team["service"], job_id)
    with queue_worker(team["data"]):
        yield job_id


def test_the_owner_and_an_admin_try_the_model_another_user_may_not(team, served_job):
    from gradio_client.exceptions import AppError

    url = team["url"]
    answer = json.loads(_client(url, "bob").predict(served_job, "the model keeps", 6, api_name="/generate"))
    pruned, dense = answer["pruned"], answer["dense"]
    assert answer["job"] == served_job and answer["max_new_tokens"] == 6
    assert pruned["tokens_per_s"] > 0 and dense["tokens_per_s"] > 0 and 1 <= pruned["tokens"] <= 6
    assert pruned["text"] == dense["text"]  # this "checkpoint" is a copy of its dense model: greedy agrees
    admin = json.loads(_client(url, "alice").predict(served_job, "the model keeps", 6, api_name="/generate"))
    assert admin["pruned"]["text"] == pruned["text"]
    with pytest.raises(AppError) as refused:
        _client(url, "carol").predict(served_job, "the model keeps", 6, api_name="/generate")
    assert str(refused.value) == f"job {served_job} is bob's: only its owner or an administrator may generate from it"
    with pytest.raises(AppError, match="tokens: a whole number from 1 to 256, not 0"):
        _client(url, "bob").predict(served_job, "the model keeps", 0, api_name="/generate")


def test_serving_forms_through_the_api(team, served_job):
    from gradio_client.exceptions import AppError

    url = team["url"]
    listed = json.loads(_client(url, "bob").predict(served_job, api_name="/serving_forms"))
    forms = {f["form"]: f for f in listed["forms"]}
    assert not forms["gguf-f16"]["possible"] and "it is WordLevel" in forms["gguf-f16"]["problem"]
    assert forms["vllm"]["possible"]  # the dense tiny model keeps every head in every layer
    with pytest.raises(AppError, match="gguf-q8_0 cannot be written from job .*: cannot write the tokenizer"):
        _client(url, "bob").predict(served_job, "gguf-q8_0", api_name="/export_job")
    with pytest.raises(AppError, match="only its owner or an administrator may export it"):
        _client(url, "carol").predict(served_job, api_name="/serving_forms")


ENDPOINTS = ("generate", "serving_forms", "export_job")


def test_no_answer_without_a_login_and_no_server_internals_in_any(team, served_job, broker_down, llama_dir):
    url, data = team["url"], team["data"]
    for name in ENDPOINTS:
        got = httpx.post(f"{url}gradio_api/call/{name}", json={"data": [served_job]})
        assert got.status_code == 401, (name, got.status_code, got.text[:200])
    bob, carol = _client(url, "bob"), _client(url, "carol")
    probes = [
        (bob, "/generate", (999, "hello", 4)),
        (bob, "/generate", (served_job, "", 4)),
        (bob, "/generate", (served_job, "hello", 10**6)),
        (carol, "/generate", (served_job, "hello", 4)),
        (bob, "/serving_forms", (999,)),
        (bob, "/export_job", (served_job, "onnx")),
        (bob, "/export_job", (served_job, "")),
        (bob, "/export_job", (served_job, "gguf-f16")),
        (carol, "/export_job", (served_job, "vllm")),
    ]
    for client, endpoint, args in probes:
        with pytest.raises(Exception) as caught:
            client.predict(*args, api_name=endpoint)
        message = str(caught.value)
        assert message.strip() and "\n" not in message.strip(), (endpoint, args)
        _clean(message, data)
    # the broker down, its password in its URL: one sentence with an error id
    from jobs.service import JobService
    from jobs.settings import Settings

    down = broker_down["data"]
    seeding = JobService(
        Settings(data_dir=down, database_url=f"sqlite:///{down / 'liar.db'}", broker_url="filesystem://")
    )
    job_id = _finished(seeding, llama_dir, "bob")
    try:
        with pytest.raises(Exception) as caught:
            _client(broker_down["url"], "bob").predict(job_id, "hello", 4, api_name="/generate")
    finally:  # that server's own tests expect it to hold no job (tests/app/test_team.py)
        seeding.delete(job_id)
    message = str(caught.value)
    _clean(message, down)
    assert message.startswith("the job broker did not take the prompt") and "error id" in message
    assert "127.0.0.1" not in message
