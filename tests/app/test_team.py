"""A team's server, through its API and download routes, with login on: three accounts (alice an
admin, bob, carol), downloads for owners only. Every action × (owner, another user, an admin,
nobody logged in) is allowed or refused as ``jobs.access`` says, a refusal changes nothing, and no
answer carries a secret, a traceback, a class name or a server path (a table of error probes)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import httpx
import pytest
import yaml

from jobs.db import Job, JobLog, Status
from tests.app.conftest import BROKER_SECRET, PASSWORDS
from tests.app.test_access import _finished, _snapshot
from tests.jobs.test_reevaluation import seed_failed_evaluation

pytestmark = pytest.mark.integration  # a running app

# ``team`` and ``broker_down``, the servers these tests use, and their accounts (PASSWORDS) are
# tests.app.conftest's: each started once a session, in parallel with the app tests' other servers


def _client(url: str, user: str | None):
    from gradio_client import Client

    return Client(url, auth=(user, PASSWORDS[user]), verbose=False)


@contextmanager
def _browser(url: str, user: str) -> Iterator[httpx.Client]:
    """An HTTP client logged in as ``user`` (the login cookie), as a browser would be."""
    with httpx.Client(base_url=url) as browser:
        assert browser.post("login", data={"username": user, "password": PASSWORDS[user]}).status_code == 200
        yield browser


def _text(team) -> str:
    return str(team["data"] / "texts" / "tiny-demo.txt")


def _recipe(team, **over) -> str:
    data = team["data"]
    recipe = {
        "model": str(team["model"]),
        "ratio": 0.3,
        "calibration": {"dataset": str(data / "texts" / "tiny-demo.txt"), "max_seq_length": 32},
    }
    return yaml.safe_dump({**recipe, **over})


API_ACTIONS = ("/cancel_job", "/rerun_job", "/delete_job", "/download")


def test_every_action_through_the_api_by_every_kind_of_user(team):
    url, service = team["url"], team["service"]
    clients = {user: _client(url, user) for user in PASSWORDS}
    refused = allowed = 0
    for action in API_ACTIONS:
        for user, allowed_here in (("carol", False), ("bob", True), ("alice", True)):
            queued = clients["bob"].predict(_recipe(team), api_name="/submit")["id"]
            done = _finished(service, team["model"], "bob", _text(team))  # the server is offline: a file
            for job in (queued, done):
                if action == "/delete_job" and job == queued and allowed_here:
                    continue  # a queued job must be cancelled first (test_access)
                if action == "/download" and job == queued:
                    continue
                before = _snapshot(service)
                if allowed_here:
                    clients[user].predict(job, api_name=action)
                    allowed += 1
                    continue
                with pytest.raises(Exception, match=rf"job {job} is bob's: only its owner or an administrator may"):
                    clients[user].predict(job, api_name=action)
                assert _snapshot(service) == before, (action, user, job)
                refused += 1
    assert refused == 7 and allowed == 12
    # a re-run is the clicking account's job
    done = _finished(service, team["model"], "bob", _text(team))
    new = clients["alice"].predict(done, api_name="/rerun_job")["id"]
    assert json.loads(clients["carol"].predict(new, api_name="/show_job"))["submitted_by"] == "alice"
    # everyone sees every job (a team dashboard)
    assert {j["id"] for j in json.loads(clients["carol"].predict(api_name="/list_jobs"))} >= {done, new}


def test_downloads_are_for_owners_and_admins_when_the_server_says_so(team):
    url, service = team["url"], team["service"]
    done = _finished(service, team["model"], "bob")
    urls = [f"jobs/{done}/files/config.json", f"jobs/{done}/checkpoint.tar"]
    for path in urls:
        assert httpx.get(url + path).status_code == 401  # nobody logged in
    for user, status in (("carol", 403), ("bob", 200), ("alice", 200)):
        with _browser(url, user) as browser:
            for path in urls:
                got = browser.get(path)
                assert got.status_code == status, (user, path, got.text[:200])
                if status == 403:
                    assert (
                        got.json()["detail"]
                        == f"job {done} is bob's: only its owner or an administrator may download it"
                    )


ENDPOINTS = ("submit", "list_jobs", "show_job", "cancel_job", "rerun_job", "reevaluate_job", "delete_job", "download")


def test_nothing_answers_without_a_login(team):
    url = team["url"]
    for name in ENDPOINTS:
        got = httpx.post(f"{url}gradio_api/call/{name}", json={"data": [1]})
        assert got.status_code == 401, (name, got.status_code, got.text[:200])
    for path in ("config", "gradio_api/info", "jobs/1/files/config.json", "jobs/1/checkpoint.tar"):
        assert httpx.get(url + path).status_code == 401, path
    with pytest.raises(Exception):  # noqa: B017 - gradio_client cannot even read the API without a login
        from gradio_client import Client

        Client(url, verbose=False).predict(api_name="/list_jobs")


# --- error probes: nothing a user reads carries a server path, a secret, a traceback or a class name --


def _clean(message: str, data, typed: str = "") -> None:
    """No secret, traceback, class name or server path in ``message`` (a path the probe typed may be
    echoed back: it is the user's own)."""
    assert BROKER_SECRET not in message and "Traceback" not in message and 'File "' not in message, message
    assert not re.match(r"^\s*(\w+\.)*[A-Z]\w*(Error|Exception):", message), message
    for path in re.findall(r"(?<![\w.:])/[\w.\-]+(?:/[\w.\-]+)+", message):
        assert path in typed, f"a server path in {message!r}: {path}"
    assert str(data) not in (message.replace(typed, "") if typed else message), message


def test_no_secret_or_server_path_in_any_answer(team, broker_down):
    url, data, service = team["url"], team["data"], team["service"]
    bob, carol = _client(url, "bob"), _client(url, "carol")
    queued = bob.predict(_recipe(team), api_name="/submit")["id"]
    # a job that failed before errors were made public: its stored text holds a path and a class name
    with service.sessions.begin() as s:
        old = Job(recipe={"model": "m", "ratio": 0.3}, evaluations=[], status=Status.FAILED.value, submitted_by="bob")
        s.add(old)
        s.flush()
        old.error = f"RuntimeError: {data}/artifacts/job-{old.id}/x.safetensors: short read"
        s.add(JobLog(job_id=old.id, level="ERROR", message=f"failed: {old.error}"))
        old_id = old.id
    outside = "/etc/passwd"
    probes = [
        (bob, "/submit", ("not: [valid",), ""),
        (bob, "/submit", ("!!python/object/apply:os.system ['id']",), ""),
        (bob, "/submit", ("- a list",), ""),
        (bob, "/submit", (_recipe(team, ratio=1.5),), str(team["model"])),
        (bob, "/submit", (_recipe(team, model=outside),), outside),
        (bob, "/submit", (_recipe(team, model="../../liar.db"),), "../../liar.db"),
        (bob, "/submit", (_recipe(team, calibration={"dataset": f"{data}/liar.db"}),), f"{data}/liar.db"),
        (bob, "/submit", (_recipe(team, model="job:999"),), ""),
        (bob, "/submit", (_recipe(team, model=f"job:{queued}"),), ""),
        (bob, "/submit", (_recipe(team, criterion={"name": "nonsense"}),), str(team["model"])),
        (bob, "/submit", (_recipe(team, reconstruction={"method": "magic"}),), str(team["model"])),
        (bob, "/submit", (_recipe(team), "", "", 0, "piqa", "/tmp"), "/tmp"),
        (bob, "/submit", (_recipe(team), "", "", 0, "no_such_task"), ""),
        (bob, "/submit", (_recipe(team), "", outside), outside),
        (bob, "/submit", (_recipe(team), "", "wikitext2", 99999), ""),
        (bob, "/show_job", (999,), ""),
        (bob, "/cancel_job", (999,), ""),
        (bob, "/download", (999,), ""),
        (bob, "/delete_job", (queued,), ""),
        (carol, "/rerun_job", (queued,), ""),
        (carol, "/delete_job", (old_id,), ""),
        (carol, "/cancel_job", (queued,), ""),
    ]
    said = []
    for client, endpoint, args, typed in probes:
        with pytest.raises(Exception) as caught:
            client.predict(*args, api_name=endpoint)
        message = str(caught.value)
        assert message.strip(), (endpoint, args)
        _clean(message, data, typed)
        said.append(message)
    # the stored error and log of the old job, as users see them
    info = json.loads(bob.predict(old_id, api_name="/show_job"))
    for text in [info["error"], *(x["message"] for x in info["log"])]:
        _clean(text, data)
    assert info["error"] == "x.safetensors: short read" and "traceback" not in info
    assert all("path" not in a for a in json.loads(bob.predict(queued, api_name="/show_job"))["artifacts"])
    # the download routes' refusals
    with _browser(url, "bob") as browser:
        for path in (f"jobs/{queued}/files/..%2F..%2Fliar.db", f"jobs/{queued}/checkpoint.tar", "jobs/999/files/x"):
            got = browser.get(path)
            assert got.status_code in (400, 404) and got.text, path
            _clean(got.text, data)
    # the broker down, its password in its URL: one sentence with an error id, nothing created
    down = _client(broker_down["url"], "bob")
    recipe = _recipe({**team, "data": broker_down["data"], "model": broker_down["data"] / "models" / "tiny-llama-demo"})
    with pytest.raises(Exception) as caught:
        down.predict(recipe, api_name="/submit")
    message = str(caught.value)
    _clean(message, broker_down["data"])
    assert "could not queue the job" in message and "error id" in message and "127.0.0.1" not in message
    assert json.loads(down.predict(api_name="/list_jobs")) == []
    assert len(said) + 1 + 3 + 1 >= 20  # probes: API answers, the old job, the download routes, the broker


def test_the_job_commands_against_the_server_follow_its_rules(team):
    """``liar jobs … --server URL``: an account of the app, under the app's rules (not the database's
    operator)."""
    import os
    import subprocess
    import sys

    url, service = team["url"], team["service"]
    queued = _client(url, "bob").predict(_recipe(team), api_name="/submit")["id"]

    def liar(user: str, *args: str, password: str | None = None) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
        env.update(LIAR_SERVER_USER=user, LIAR_SERVER_PASSWORD=password or PASSWORDS[user], LIAR_SERVER=url)
        cmd = [sys.executable, "-m", "app.cli", "jobs", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    before = _snapshot(service)
    # the commands that change nothing run at once (each is a Python process starting up)
    with ThreadPoolExecutor(6) as pool:
        listed = pool.submit(liar, "carol", "list", "--json")
        refusals = {verb: pool.submit(liar, "carol", verb, str(queued)) for verb in ("cancel", "rerun", "delete")}
        wrong = pool.submit(liar, "bob", "list", password="not-bobs")
        shown = pool.submit(liar, "bob", "show", str(queued))
    listed, wrong, shown = listed.result(), wrong.result(), shown.result()
    assert listed.returncode == 0 and queued in {j["id"] for j in json.loads(listed.stdout)}
    for verb, running in refusals.items():
        refused = running.result()
        assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
        assert refused.stderr.strip().endswith(f"job {queued} is bob's: only its owner or an administrator may "
                                               f"{verb.replace('rerun', 're-run')} it"), refused.stderr  # fmt: skip
    assert _snapshot(service) == before
    assert wrong.returncode == 2 and "cannot use the server at" in wrong.stderr and "Traceback" not in wrong.stderr
    assert shown.returncode == 0 and "submitted_by: bob" in shown.stdout
    assert liar("bob", "cancel", str(queued)).stdout.strip() == f"job {queued}: CANCELLED"
    new = liar("bob", "rerun", str(queued))
    assert new.returncode == 0 and new.stdout.startswith(f"job {queued}: re-submitted as job ")
    assert json.loads(_client(url, "bob").predict(queued, api_name="/show_job"))["status"] == "CANCELLED"


def test_re_evaluation_through_the_api_and_the_command(team):
    """``/reevaluate_job`` and ``liar jobs reevaluate --server``: the job's owner or an admin, as a job
    of that account; another account is refused in one sentence (exit 2 for the command) and nothing
    changes."""
    import os
    import subprocess
    import sys

    url, service = team["url"], team["service"]
    held = team["data"] / "texts" / "tiny-demo.txt"  # inside the server's data folders
    first, second = (seed_failed_evaluation(service, team["model"], held) for _ in range(2))
    bob, carol = _client(url, "bob"), _client(url, "carol")
    before = _snapshot(service)
    with pytest.raises(Exception, match=rf"job {first} is bob's: only its owner or an administrator may re-evaluate"):
        carol.predict(first, api_name="/reevaluate_job")
    with pytest.raises(Exception, match="the job has 1 evaluation: there is no evaluation 3"):
        bob.predict(first, "3", api_name="/reevaluate_job")

    def liar(user: str, *args: str) -> subprocess.CompletedProcess:
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
        env.update(LIAR_SERVER_USER=user, LIAR_SERVER_PASSWORD=PASSWORDS[user], LIAR_SERVER=url)
        cmd = [sys.executable, "-m", "app.cli", "jobs", "reevaluate", *args]
        return subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120, stdin=subprocess.DEVNULL)

    refused = liar("carol", str(second))
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr
    assert refused.stderr.strip().endswith(
        f"job {second} is bob's: only its owner or an administrator may re-evaluate it"
    )
    assert _snapshot(service) == before
    new = bob.predict(first, api_name="/reevaluate_job")["id"]
    info = json.loads(carol.predict(new, api_name="/show_job"))
    assert info["source_job"] == first and info["submitted_by"] == "bob" and info["status"] == "QUEUED"
    done = liar("alice", str(second), "--evaluations", "all")  # an administrator, anyone's job
    assert done.returncode == 0 and done.stdout.startswith(f"job {second}: evaluations run again on its checkpoint")
    later = int(done.stdout.split("as job ")[1].split()[0])
    assert json.loads(carol.predict(later, api_name="/show_job"))["submitted_by"] == "alice"
