"""Running `liar app` servers on free ports, shared by the app tests (started together: ``app_servers``)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.jobs.conftest import wait_for


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Launch:
    """A `liar app` process started on a free port, perhaps not answering yet (:meth:`ready` waits)."""

    def __init__(self, data: Path, *args: str, **extra_env: str):
        self.data, self.port = data, _free_port()
        self.url = f"http://127.0.0.1:{self.port}/"
        env = {k: v for k, v in os.environ.items() if not k.startswith("LIAR_")}
        env.update(
            LIAR_DATA_DIR=str(data),
            LIAR_BUNDLED="tiny",  # the tiny demo model and text only: no SmolLM2 prepared per test server
            LIAR_WORKER_MAX_TASKS_PER_CHILD="20",
            GRADIO_ANALYTICS_ENABLED="False",
            PYTHONPATH=str(Path(__file__).resolve().parents[2]),
            **extra_env,
        )
        data.mkdir(parents=True, exist_ok=True)
        self.log = data.parent / f"app-{self.port}.log"
        with open(self.log, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "app.cli", "app", "--port", str(self.port), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def ready(self) -> tuple[subprocess.Popen, str]:
        """Wait until the app answers its first page; (process, url)."""

        def serves():  # listening is not yet serving: the page answers once the app is mounted
            try:
                with urllib.request.urlopen(self.url, timeout=5):
                    return True
            except urllib.error.HTTPError as exc:
                return exc.code < 500  # a login page or a refusal: the app answers
            except OSError:
                assert self.proc.poll() is None, self.log.read_text()[-3000:]
                return False

        def routed():  # the download and health routes are added just after the app starts serving
            try:
                with urllib.request.urlopen(self.url + "healthz", timeout=5):
                    return True
            except urllib.error.HTTPError as exc:
                return exc.code != 404  # 503: a part is down, which some tests set up on purpose
            except OSError:
                return False

        wait_for(serves, timeout=180, every=0.1, what="the app to answer")
        wait_for(routed, timeout=60, every=0.1, what="the app's own routes")
        return self.proc, self.url


def start_app(data: Path, *args: str, **extra_env: str):
    """Start `liar app` on a free port with its data under ``data``; returns (process, url) once it
    answers."""
    return Launch(data, *args, **extra_env).ready()


def stop_app(proc) -> None:
    """SIGKILL the app's process group (the app, its embedded worker and the worker's children): a
    SIGTERM waited up to 10 s for the worker's warm shutdown, which no test reads."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


# --- the session's app servers, started together ---------------------------------------------------
#
# Starting `liar app` is mostly imports on one core (gradio, torch, transformers: about 15 s). The
# servers below are started at once, in parallel, when the first of them is asked for, each only if a
# selected test uses it; each fixture then waits for its own to answer.

PASSWORDS = {"alice": "alice-pw", "bob": "bob-pw", "carol": "carol-pw"}  # alice: an admin of `team`
BROKER_SECRET = "s3cret-broker-pw"


def team_users(*names: str, admin: str | None = "alice") -> str:
    """``LIAR_APP_USERS`` for these accounts of :data:`PASSWORDS` (all of them by default), hashed."""
    from app.web.auth import hash_password

    return ",".join(f"{u}:{hash_password(PASSWORDS[u])}{':admin' if u == admin else ''}" for u in names or PASSWORDS)


def _app_server_launch(base: Path) -> Launch:
    """No login, an embedded worker, and an encoder to pick in the form."""
    from core.models.tiny import tiny_bert

    data = base / "data"
    tiny_bert(data / "models" / "tiny-bert")
    return Launch(data)


def _login_server_launch(base: Path) -> Launch:
    """Login on for alice and bob (neither an admin), its embedded worker pausing 2 s in each layer and
    each evaluation (``LIAR_STAGE_PAUSE``), so a running job can be watched on a machine of any speed."""
    users = team_users("alice", "bob", admin=None)  # stored hashed, never in plain text
    return Launch(base / "data", LIAR_APP_USERS=users, LIAR_STAGE_PAUSE="reconstruct=2,evaluate=2")


def _team_launch(base: Path) -> Launch:
    """No worker; alice (an admin), bob and carol; downloads for owners."""
    return Launch(base / "data", "--no-worker", LIAR_APP_USERS=team_users(), LIAR_DOWNLOADS="owners")


def _broker_down_launch(base: Path) -> Launch:
    """The team's app whose broker (a password in its URL) is down: every submission fails to queue."""
    broker = f"redis://:{BROKER_SECRET}@127.0.0.1:{_free_port()}/0"
    return Launch(base / "data", "--no-worker", LIAR_APP_USERS=team_users(), LIAR_BROKER_URL=broker)


SERVERS = {
    "app_server": ("app", _app_server_launch),
    "login_server": ("login", _login_server_launch),
    "team": ("team", _team_launch),
    "broker_down": ("down", _broker_down_launch),
}


@pytest.fixture(scope="session")
def app_servers(request, tmp_path_factory):
    """The app servers the selected tests use, started together at the first request; ``get(name)``
    waits for one to answer and gives (process, url, data). All are stopped at the session's end."""
    wanted = {name for item in request.session.items for name in SERVERS if name in item.fixturenames}
    launched: dict[str, Launch] = {}

    def launch(name: str) -> Launch:
        if name not in launched:
            folder, how = SERVERS[name]
            launched[name] = how(tmp_path_factory.mktemp(folder))
        return launched[name]

    def get(name: str) -> tuple[subprocess.Popen, str, Path]:
        for other in sorted(wanted):  # the others boot while this one does
            launch(other)
        proc, url = launch(name).ready()
        return proc, url, launched[name].data

    yield get
    for started in launched.values():
        stop_app(started.proc)


@pytest.fixture(scope="session")
def app_server(app_servers):
    _, url, data = app_servers("app_server")
    return {"url": url, "data": data}


@pytest.fixture(scope="session")
def login_server(app_servers):
    """``liar app`` with login on for two accounts (:data:`PASSWORDS`' alice and bob) and a worker that
    pauses in each layer and evaluation (:func:`_login_server_launch`)."""
    _, url, data = app_servers("login_server")
    return {"url": url, "data": data}


@pytest.fixture(scope="session")
def team(app_servers):
    """``liar app`` (no worker) with three accounts (alice an admin, bob, carol; :data:`PASSWORDS`) and
    downloads for owners; ``service`` is a JobService on its database, for seeding jobs."""
    from jobs.service import JobService
    from jobs.settings import Settings

    _, url, data = app_servers("team")
    database = f"sqlite:///{data / 'liar.db'}"
    service = JobService(Settings(data_dir=data, database_url=database, broker_url="filesystem://"))
    return {"url": url, "data": data, "service": service, "model": data / "models" / "tiny-llama-demo"}


@pytest.fixture(scope="session")
def broker_down(app_servers):
    """The team's app, but its broker (a password in its URL) is down: every submission fails to queue."""
    _, url, data = app_servers("broker_down")
    return {"url": url, "data": data}


@pytest.fixture()
def job_service(tmp_path, tmp_path_factory):
    """A JobService on SQLite and the filesystem broker under ``tmp_path`` (jobs queue; no worker runs
    them) whose web submissions may read the session's test models and texts (pytest's base temp dir)."""
    from jobs.service import JobService
    from jobs.settings import Settings

    data = tmp_path / "data"
    settings = Settings(
        data_dir=data,
        database_url=f"sqlite:///{data / 'liar.db'}",
        broker_url="filesystem://",
        data_roots=(tmp_path_factory.getbasetemp(),),
        task_dirs=(data / "tasks",),  # the folders of lm-eval YAMLs an administrator allows
    )
    settings.ensure_dirs()
    return JobService(settings)
