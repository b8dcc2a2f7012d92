"""Who may do what (``jobs.access``, applied by ``JobService``), the login (``app.web.auth``), and what
users may see of a failure: every action × (owner, another user, an admin), and the job references
(``model: job:N``) that replace server paths."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from sqlalchemy import select

from app.web import views
from app.web.auth import Login, LoginError, hash_password, parse_accounts, verify_password
from jobs.access import OPEN, Actor, Forbidden, public_error, public_message, scrub_text
from jobs.artifacts import job_dir
from jobs.db import Artifact, Job, JobLog, Metric, Status
from jobs.service import JobService, NotNow, SubmitError
from jobs.settings import Settings

ADMIN, OWNER, OTHER = Actor("alice", admin=True), Actor("bob"), Actor("carol")


@pytest.fixture(params=["sqlite", "postgresql"])
def database(request):
    """The job database of a test: SQLite (the default), or a fresh one on the real PostgreSQL (the
    refusals are checked inside the row-locking transaction that would change the job)."""
    if request.param == "sqlite":
        yield None
        return
    from tests.jobs.conftest import postgres_database

    with postgres_database("liar_access") as url:
        yield url


def _service(tmp_path, llama_dir, database: str | None = None, **over) -> JobService:
    data = tmp_path / "data"
    settings = Settings(
        data_dir=data,
        database_url=database or f"sqlite:///{data / 'liar.db'}",
        broker_url="filesystem://",
        data_roots=(llama_dir.parent,),  # the test model's folder
        **over,
    )
    settings.ensure_dirs()
    return JobService(settings)


def _finished(service: JobService, llama_dir, owner: str, dataset: str = "wikitext2") -> int:
    """A job of ``owner`` that finished with a checkpoint (a copy of the tiny model in its folder,
    recorded as a worker would): a row, its files, a metric and a log line. ``dataset``: its
    calibration set (a file, for a job an offline server re-runs)."""
    job_id = service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": dataset}}, owner)
    checkpoint = job_dir(service.settings.artifacts_dir, job_id) / "attempt-1" / "checkpoint"
    shutil.copytree(llama_dir, checkpoint)
    with service.sessions.begin() as s:
        job = s.get(Job, job_id)
        job.status, job.stage = Status.SUCCEEDED.value, "done"
        s.add(Artifact(job_id=job_id, kind="checkpoint", path=str(checkpoint), size=1))
        for f in sorted(checkpoint.iterdir()):
            s.add(
                Artifact(job_id=job_id, kind="file", name=f.name, path=str(f), size=f.stat().st_size, sha256="0" * 64)
            )
        s.add(Metric(job_id=job_id, name="perplexity", value=12.5))
    return job_id


def _snapshot(service: JobService) -> tuple:
    """Every row of the job tables, and the artifacts folder's files: what a refused action must not change."""
    with service.sessions() as s:
        tables = (Job, JobLog, Metric, Artifact)
        rows = tuple(
            tuple(tuple(getattr(r, c.name) for c in t.__table__.c) for r in s.scalars(select(t).order_by(t.id)))
            for t in tables
        )
    files = tuple(sorted(str(p) for p in service.settings.artifacts_dir.rglob("*")))
    return rows, files


ACTIONS = {
    "cancel": lambda service, job, actor: service.cancel(job, actor),
    "re-run": lambda service, job, actor: service.rerun(job, actor, confine=True),
    "delete": lambda service, job, actor: service.delete(job, actor),
    "list files of": lambda service, job, actor: service.downloads(job, actor),
    "download a file of": lambda service, job, actor: service.file(job, "config.json", actor),
    "download": lambda service, job, actor: service.checkpoint_tar(job, actor),
}
CHANGES = ("cancel", "re-run", "delete")  # the others read; they are refused only with LIAR_DOWNLOADS=owners


@pytest.mark.parametrize("downloads", ["all", "owners"])
@pytest.mark.parametrize("action", list(ACTIONS))
@pytest.mark.parametrize("actor", [OWNER, OTHER, ADMIN, Actor(None)], ids=["owner", "other", "admin", "nobody"])
def test_every_action_by_every_kind_of_user(tmp_path, llama_dir, database, downloads, action, actor):
    """The owner and an admin may; another user, or a request with no account behind it, is refused
    with one sentence and nothing changes (no row, no file, no log line)."""
    service = _service(tmp_path, llama_dir, database, downloads=downloads)
    queued = service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2"}}, "bob")
    done = _finished(service, llama_dir, "bob")
    allowed = actor in (OWNER, ADMIN) or (action not in CHANGES and downloads == "all")
    for job in (queued, done):
        if action == "delete" and job == queued and allowed:
            continue  # a queued job is cancelled before it is deleted (below)
        if action in ("list files of", "download a file of", "download") and job == queued:
            continue  # nothing to download yet
        before = _snapshot(service)
        if allowed:
            ACTIONS[action](service, job, actor)
            continue
        with pytest.raises(Forbidden) as refused:
            ACTIONS[action](service, job, actor)
        verb = action if action in CHANGES else "download"
        assert str(refused.value) == f"job {job} is bob's: only its owner or an administrator may {verb} it"
        assert _snapshot(service) == before


def test_cancel_rerun_and_delete_say_who_and_what(tmp_path, llama_dir, database, caplog):
    service = _service(tmp_path, llama_dir, database)
    queued = service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2"}}, "bob")
    with pytest.raises(NotNow, match=f"job {queued} is QUEUED: cancel it first, then delete it"):
        service.delete(queued, OWNER)
    assert service.cancel(queued, ADMIN) == "CANCELLED"
    info = service.show(queued)
    assert info["error"] == "cancelled by alice" and info["log"][-1]["message"] == "cancel requested by alice"
    new = service.rerun(queued, ADMIN)
    assert service.show(new)["submitted_by"] == "alice"
    assert service.show(new)["log"][0]["message"] == f"submitted by alice (re-run of job {queued})"
    done = _finished(service, llama_dir, "bob")
    folder = job_dir(service.settings.artifacts_dir, done)
    assert folder.is_dir()
    with caplog.at_level("INFO", logger="jobs.service"):
        service.delete(done, ADMIN)
    assert not folder.exists() and done not in {j["id"] for j in service.list()}
    assert f"job {done} deleted by alice" in caplog.text  # and the tombstone says it to whoever asks
    with pytest.raises(KeyError, match=f"job {done} was deleted by alice on "):
        service.show(done)
    # the UI's words for the same refusals
    assert (
        views.cancel_job(service, new, OTHER)
        == f"**⚠ job {new} is alice's: only its owner or an administrator may cancel it**"
    )
    assert views.delete_job(service, new, OTHER).startswith(f"**⚠ job {new} is alice's")
    assert (
        views.delete_job(service, new, Actor("alice")) == f"**⚠ job {new} is QUEUED: cancel it first, then delete it**"
    )
    assert views.delete_job(service, 999, ADMIN) == "**⚠ no job 999**"
    heading = views.job_heading(service.show(queued))
    assert "**Cancelled:** cancelled by alice" in heading and "Error" not in heading  # a cancel is no error
    # the queue says where a job stands
    later = service.submit({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2"}}, "bob")
    stages = {row[0]: row[2] for row in views.job_rows(service)}
    assert stages[new] == "queued" and stages[later] == "queued (1 ahead)"
    assert ("all", "") in views.STATUSES  # the Status filter's "no filter" has a name
    # Cancel while a job can still stop, Delete once it has finished (Re-evaluate: test_reevaluate)
    assert views.actions_enabled(service, later) == (True, False, False)
    assert views.actions_enabled(service, queued) == (False, True, False)
    assert views.actions_enabled(service, None) == views.actions_enabled(service, 999) == (False, False, False)
    # without a login nobody can be told apart: the open server lets anyone act (as before)
    assert service.cancel(new, OPEN) == "CANCELLED" and service.show(new)["error"] == "cancelled by request"


def test_a_jobs_checkpoint_is_named_by_its_id_never_by_a_server_path(tmp_path, llama_dir):
    service = _service(tmp_path, llama_dir, downloads="owners")
    done = _finished(service, llama_dir, "bob")
    checkpoint = service.artifact(done)
    again = {"model": f"job:{done}", "ratio": 0.2, "calibration": {"dataset": "wikitext2"}}
    new = service.submit(again, "bob", confine=True, actor=OWNER)
    info = service.show(new)
    assert info["model"] == info["recipe"]["model"] == f"job:{done}"  # stored as written
    for refused, actor, expected in (
        ({**again, "model": "job:999"}, OWNER, "model job:999: there is no job 999"),
        ({**again, "model": f"job:{new}"}, OWNER, f"model job:{new}: that job is QUEUED"),
        (again, OTHER, f"job {done} is bob's: only its owner or an administrator may use the checkpoint of it"),
        ({**again, "model": str(checkpoint)}, OWNER, "a job's folder on this server: name a job's checkpoint by"),
        ({**again, "calibration": {"dataset": str(service.settings.data_dir / "liar.db")}}, OWNER, "outside the"),
    ):
        with pytest.raises(SubmitError) as caught:
            service.submit(refused, actor.name, confine=True, actor=actor)
        assert expected in str(caught.value)
        assert refused["model"] == str(checkpoint) or str(checkpoint) not in str(caught.value)  # unless typed
    assert len(service.list()) == 2  # nothing was created


def test_the_data_roots_exclude_the_database_the_artifacts_and_the_broker(tmp_path, llama_dir):
    service = _service(tmp_path, llama_dir)
    data = service.settings.data_dir
    for inside in (data / "uploads" / "a.txt", data / "models" / "m", data / "texts" / "t.txt"):
        assert service.readable(str(inside)), inside
    for outside in (data / "liar.db", data / "artifacts" / "job-1", data / "broker" / "queue", data, "/etc/passwd"):
        assert not service.readable(str(outside)), outside
    assert not service.readable(str(data / "uploads" / ".." / "liar.db"))


def test_the_model_description_is_confined_like_every_read(llama_dir, tmp_path):
    from app.web import forms

    job_service = _service(tmp_path, llama_dir)
    outside = tmp_path / "elsewhere"
    shutil.copytree(llama_dir, outside)
    kind, text = forms.describe_model(str(outside), job_service.readable)
    assert kind is None and text == "⚠ that folder is outside the folders this server reads from"
    assert forms.describe_model(str(llama_dir), job_service.readable)[0] == "decoder"  # a data root
    assert forms.describe_model("job:3", job_service.readable)[1].startswith("a job's checkpoint")


# --- the login -------------------------------------------------------------------------------------


def test_passwords_are_stored_as_salted_hashes():
    stored = hash_password("correct horse")
    assert stored.startswith("scrypt$") and "correct" not in stored and ":" not in stored and "," not in stored
    assert stored != hash_password("correct horse")  # salted
    assert verify_password("correct horse", stored) and not verify_password("correct hors", stored)
    assert not verify_password("x", "x") and not verify_password("x", "scrypt$1$1$1$AA$AA")


def test_the_login_settings_refuse_plain_text_and_contradictions(tmp_path):
    alice, bob = hash_password("a-pw"), hash_password("b-pw")
    login = Login.from_env({"LIAR_APP_USERS": f"alice:{alice}:admin,bob:{bob}"})
    assert login.mode == "passwords" and login.admins == {"alice"}
    assert login.check_password("alice", "a-pw") and not login.check_password("alice", "b-pw")
    assert not login.check_password("mallory", "a-pw")
    users = tmp_path / "users"
    users.write_text(f"# the team\nbob:{bob}\n\n")
    login = Login.from_env({"LIAR_USERS_FILE": str(users), "LIAR_ADMINS": "bob"})
    assert login.check_password("bob", "b-pw") and login.named("bob") == Actor("bob", admin=True)
    assert Login.from_env({}).mode == "open" and Login().actor(None) == OPEN
    for env, expected in (
        ({"LIAR_APP_USERS": "alice:s3cret"}, "holds a plain-text password for 'alice'"),
        ({"LIAR_APP_USERS": f"alice:{alice},alice:{bob}"}, "names 'alice' twice"),
        ({"LIAR_APP_USERS": f"alice:{alice}:root"}, "the role is 'admin' or nothing"),
        ({"LIAR_USERS_FILE": str(tmp_path / "missing")}, "which is not a file"),
        ({"LIAR_APP_USERS": f"alice:{alice}", "LIAR_AUTH_HEADER": "X-User"}, "choose one login"),
        ({"LIAR_AUTH_HEADER": "X-User"}, "needs both LIAR_AUTH_HEADER and LIAR_TRUSTED_PROXIES"),
        ({"LIAR_AUTH_HEADER": "X-User", "LIAR_TRUSTED_PROXIES": "proxy.local"}, "is not an address"),
    ):
        with pytest.raises(LoginError) as caught:
            Login.from_env(env)
        assert expected in str(caught.value) and "s3cret" not in str(caught.value)
    with pytest.raises(LoginError, match="plain-text"):
        parse_accounts(["carol:pw"], "users")


def test_single_sign_on_believes_the_header_only_from_the_proxy():
    class Request:
        def __init__(self, host, user=None):
            self.client = type("Client", (), {"host": host})()
            self.headers = {"X-Forwarded-User": user} if user else {}

    login = Login.from_env(
        {"LIAR_AUTH_HEADER": "X-Forwarded-User", "LIAR_TRUSTED_PROXIES": "10.0.0.0/8, ::1", "LIAR_ADMINS": "ops"}
    )
    assert login.proxy_user(Request("10.1.2.3", "alice")) == "alice"
    assert login.proxy_user(Request("::1", "ops")) == "ops" and login.named("ops").admin
    assert login.proxy_user(Request("192.168.1.5", "alice")) is None  # not through the proxy: 401
    assert login.proxy_user(Request("10.1.2.3")) is None  # through it, but nobody named
    assert login.proxy_user(Request("not-an-address", "alice")) is None


def test_the_users_command_writes_hashes(tmp_path):
    users = tmp_path / "users"

    def liar(*args, password="pw-1"):
        return subprocess.run(
            [sys.executable, "-m", "app.cli", "users", *args], input=password + "\n", capture_output=True, text=True
        )

    assert liar("add", "alice", "--admin", "--file", str(users)).returncode == 0
    assert liar("add", "bob", "--file", str(users)).stdout.strip() == f"added bob in {users}"
    assert liar("add", "bob", "--file", str(users), password="pw-2").stdout.strip() == f"updated bob in {users}"
    assert users.stat().st_mode & 0o777 == 0o600 and "pw-" not in users.read_text()
    login = Login.from_env({"LIAR_USERS_FILE": str(users)})
    assert login.admins == {"alice"} and login.check_password("bob", "pw-2") and not login.check_password("bob", "pw-1")
    bad = liar("add", "a:b", "--file", str(users))
    assert (
        bad.returncode == 2
        and bad.stderr.startswith("liar: error: a user name may not")
        and "Traceback" not in bad.stderr
    )
    assert liar("remove", "bob", "--file", str(users)).returncode == 0
    assert set(Login.from_env({"LIAR_USERS_FILE": str(users)}).accounts) == {"alice"}
    assert liar("remove", "bob", "--file", str(users)).stderr.strip().endswith("has no user 'bob'")
    assert verify_password("pw-1", liar("hash").stdout.strip())


# --- what users see of a failure --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("exc", "shown"),
    [
        (RuntimeError("CUDA out of memory"), "CUDA out of memory"),
        (ValueError("/srv/liar/data/uploads/4ae1.jsonl: record 2 has no field 'text'"), "4ae1.jsonl: record 2"),
        (ConnectionError("Error 111 connecting to redis://:pw@10.0.0.5:6379/0"), "redis://***@10.0.0.5:6379/0"),
        (OSError("[Errno 28] No space left on device: '/var/lib/liar/artifacts/job-3/x'"), "No space left on device"),
        (KeyError(), "key error"),
        (Exception("torch.OutOfMemoryError: tried to allocate 2 GiB"), "tried to allocate 2 GiB"),
    ],
)
def test_public_messages_carry_no_paths_secrets_or_class_names(exc, shown):
    text = public_message(exc)
    assert shown in text and "/srv" not in text and "/var" not in text and ":pw@" not in text
    assert not text.startswith(("RuntimeError", "ValueError", "torch.", "Exception"))


def test_a_public_error_has_an_id_the_server_log_explains(caplog):
    try:
        raise RuntimeError("/home/ops/.cache/liar/model: boom")
    except RuntimeError as exc:
        with caplog.at_level("ERROR", logger="liar.errors"):
            text = public_error(exc, "job 3")
    error_id = text.split("error id ")[1].split(";")[0]
    assert text.startswith("model: boom (error id ") and "/home" not in text
    record = next(r for r in caplog.records if error_id in r.getMessage())
    assert record.exc_info is not None and "job 3" in record.getMessage()  # the detail, with its traceback
    assert scrub_text("see /a/b/c.txt and https://x.org/a/b") == "see c.txt and https://x.org/a/b"
