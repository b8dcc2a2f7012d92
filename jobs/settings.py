"""Job-runner settings, from the environment.

| variable            | default                               | meaning                                   |
|---------------------|---------------------------------------|-------------------------------------------|
| ``LIAR_DATA_DIR``   | ``~/.local/share/liar``               | database file, broker folders, artifacts |
| ``LIAR_DATABASE_URL`` | ``sqlite:///$LIAR_DATA_DIR/liar.db`` | any SQLAlchemy URL (PostgreSQL in teams) |
| ``LIAR_BROKER_URL`` | ``filesystem://`` (under the data dir) | Celery broker, e.g. ``redis://host:6379/0`` |
| ``LIAR_LEASE_SECONDS`` | ``60``                              | RUNNING without a heartbeat this long = lost |
| ``LIAR_MAX_ATTEMPTS`` | ``2``                                | runs of a job before a lost worker marks it FAILED |
| ``LIAR_DATA_ROOTS`` | (none)                                | more folders (``:``-separated) web jobs may read |
| ``LIAR_CACHE``      | ``~/.cache/liar``                     | cached benchmark models and texts (readable too) |
| ``LIAR_TASK_DIRS``  | (none)                                | folders of lm-eval task YAMLs web jobs may use |
| ``LIAR_DOWNLOADS``  | ``all``                               | ``owners``: only a job's owner and admins download |
| ``LIAR_OFFLINE``    | ``0``                                 | ``1``: the workers cannot reach the Hugging Face Hub |
|                     |                                       | (as do ``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``) |
| ``LIAR_WORKER_CLASS`` | ``cpu``                             | the workers' kind: the New-run estimate's |
| ``LIAR_STAGE_PAUSE`` | (none)                               | fault tests: ``reconstruct=2`` pauses each layer 2 s |
| ``LIAR_QUEUES``     | (none: one queue)                     | ``name:class[:GB],…``: routed queues (jobs.routing) |
| ``LIAR_STALL_MINUTES`` | ``60``                             | RUNNING, progress still this long = FAILED (0: off) |
| ``LIAR_TASK_TIME_LIMIT`` | (none)                           | hours a job may run before it is FAILED, killed |
| ``LIAR_STORE``      | (the data dir)                        | where checkpoints and uploads live: a folder or |
|                     |                                       | an fsspec URL, ``s3://bucket/prefix`` (jobs.store) |
| ``LIAR_STORE_ENDPOINT`` | (the provider's)                  | an S3-compatible server, ``http://minio:9000`` |
| ``LIAR_STORE_PRESIGN`` | ``1``                              | ``0``: downloads stream through the web app |
| ``LIAR_RETENTION_DAYS`` | (none: keep)                      | finished jobs' files removed after this many days |
| ``LIAR_CHECKPOINT_MINUTES`` | ``5``                         | a job saves a resume checkpoint at a block |
|                     |                                       | boundary at most this often (0: none)     |
| ``LIAR_STOP_SECONDS`` | ``60``                              | SIGTERM: a worker saves and requeues its job |
|                     |                                       | within this long (jobs.checkpoints)       |

The defaults need no server: SQLite and Celery's filesystem transport (which, unlike the SQLAlchemy
transport, supports the broadcast commands behind ``revoke`` and ``inspect``).
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from jobs.store import Store, store_options


def redact_url(url: str) -> str:
    """``url`` without its password (``redis://:secret@host:6379/0`` → ``redis://:***@host:6379/0``):
    what a message shown to users or written to a log may say of a broker or database."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    user = parts.username or ""
    host = parts.netloc.rpartition("@")[2]
    return urlunsplit(parts._replace(netloc=f"{user}:***@{host}"))


def scrub(text: str, *urls: str) -> str:
    """``text`` with every password of ``urls`` replaced (an exception's message may quote the URL it
    was given, or its password alone)."""
    for url in urls:
        password = urlsplit(url).password
        if password:
            text = text.replace(url, redact_url(url)).replace(password, "***")
    return text


OFFLINE_VARIABLES = ("LIAR_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE")


def offline_from_env(env: dict[str, str] | None = None) -> bool:
    """Whether this server says its workers cannot reach the Hugging Face Hub: ``LIAR_OFFLINE``, or
    the Hub libraries' own offline switches, which the workers would obey (a job then fails there)."""
    env = os.environ if env is None else env
    return any(env.get(name, "").strip().lower() in ("1", "true", "yes", "on") for name in OFFLINE_VARIABLES)


@lru_cache(maxsize=8)
def _store(url: str, cache_dir: Path, presign: bool, endpoint: str | None, pid: int) -> Store:
    """One store per process (``pid``): a client made before a fork (the worker's parent) is not used
    by its children (s3fs refuses it: "not fork-safe")."""
    try:
        return Store(url, cache_dir, presign, **store_options(endpoint))
    except (ImportError, ValueError) as exc:  # fsspec names the package the protocol needs, or the protocol
        raise ValueError(f"LIAR_STORE is {redact_url(url)}: {exc}") from None


DOWNLOAD_POLICIES = ("all", "owners")

GB = 10**9  # queue memory is given in GB, as cards are sold ("a100-40g": 40 GB)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,63}$")


@dataclass(frozen=True)
class Queue:
    """One routed queue: its ``name`` (what workers serve), the worker ``klass`` whose rates and
    device apply, and ``memory`` in bytes a run may use on its workers (None: the class's own)."""

    name: str
    klass: str
    memory: int | None = None


def parse_queues(value: str) -> tuple[Queue, ...]:
    """``LIAR_QUEUES`` as queues: comma-separated ``name:class[:GB]`` (GB may be a fraction, ``0.5``);
    empty → no routing. Raises ``ValueError`` with one sentence naming the entry at fault."""
    from core.pipeline.estimate import WORKERS  # (torch-free)

    queues: list[Queue] = []
    for entry in (e.strip() for e in value.split(",")):
        if not entry:
            continue
        parts = [p.strip() for p in entry.split(":")]
        if len(parts) not in (2, 3) or not _NAME.match(parts[0]):
            raise ValueError(f"LIAR_QUEUES entry {entry!r} is not name:class[:GB] (e.g. a100-40g:a100-80gb:40)")
        if parts[1] not in WORKERS:
            raise ValueError(f"LIAR_QUEUES entry {entry!r}: the class is one of {', '.join(WORKERS)}")
        memory = None
        if len(parts) == 3:
            try:
                memory = round(float(parts[2]) * GB)
            except ValueError:
                memory = 0
            if memory <= 0:
                raise ValueError(f"LIAR_QUEUES entry {entry!r}: the memory is a positive number of GB")
        if any(q.name == parts[0] for q in queues):
            raise ValueError(f"LIAR_QUEUES names the queue {parts[0]!r} twice")
        queues.append(Queue(parts[0], parts[1], memory))
    return tuple(queues)


def _duration(name: str, default: float) -> float:
    """A duration setting: a number, 0 or more."""
    text = os.environ.get(name, "").strip() or str(default)
    try:
        value = float(text)
    except ValueError:
        value = -1.0
    if not value >= 0 or value == float("inf"):
        raise ValueError(f"{name} is {text!r}; give a number, 0 or more")
    return value


def _paths(value: str) -> tuple[Path, ...]:
    """``a:b:c`` as paths (``~`` expanded), empty parts skipped."""
    return tuple(Path(p).expanduser() for p in value.split(os.pathsep) if p.strip())


@dataclass(frozen=True)
class Settings:
    data_dir: Path
    database_url: str
    broker_url: str
    lease_seconds: float = 60.0
    max_attempts: int = 2  # runs of a job before a lost worker fails it; a polite stop (SIGTERM) does not count
    data_roots: tuple[Path, ...] = ()  # beyond the data dir and the cache: folders the web app may read
    # lm-eval task folders a web or API job may name: their YAMLs can run Python (``!function``), so
    # only an administrator's list, never the data folders
    task_dirs: tuple[Path, ...] = ()
    downloads: str = "all"  # "owners": a job's files go to its owner and the admins only
    # the workers cannot reach the Hugging Face Hub: a hub id not already cached, a named dataset or a
    # registry lm-eval task is refused at submission instead of failing on the worker
    offline: bool = False
    # what the workers are (core.pipeline.estimate.WORKERS): the New-run page estimates time and memory
    # on it before Submit
    worker_class: str = "cpu"
    # seconds a worker waits at the start of each step of a stage, once the step is recorded: lets the
    # fault tests (tests/jobs/test_faults.py) land a kill or a cancel inside a layer; empty in production
    stage_pause: tuple[tuple[str, float], ...] = ()
    # the worker queues jobs are routed to by their estimated memory (jobs.routing); empty: the one
    # default queue, nothing routed
    queues: tuple[Queue, ...] = ()
    # a RUNNING job whose progress has not moved this long is hung (its heartbeat, a thread of its
    # own, goes on regardless): the reaper fails it (jobs.watchdog). Generous: one step of a stage (a
    # model's download, one lm-eval task) may take long without a progress call; 0 turns it off
    stall_minutes: float = 60.0
    # hours a job may run at all (None: no limit); the reaper fails it then, Celery kills it a little later
    task_time_limit_hours: float | None = None
    # where checkpoints and uploads live (jobs.store): None is the data folder itself; a folder or an
    # fsspec URL otherwise, the data folder then this host's scratch space and cache
    store_url: str | None = None
    store_endpoint: str | None = None  # an S3-compatible server's address (MinIO, Ceph)
    presign: bool = True  # downloads from a remote store go to users as signed addresses
    # days after which a finished job's files are removed (its record, metrics and log stay); None: kept
    retention_days: float | None = None
    # a job's block loop saves a checkpoint (jobs.checkpoints) at a block boundary at most this often, so a
    # lost or stopped attempt's successor resumes after it; 0: no checkpoints
    checkpoint_minutes: float = 5.0
    # on SIGTERM a worker finishes its block, saves and requeues the job within this long, or is let go
    stop_seconds: float = 60.0

    @classmethod
    def from_env(cls, **overrides) -> Settings:
        data_dir = Path(os.environ.get("LIAR_DATA_DIR", Path.home() / ".local" / "share" / "liar")).expanduser()
        values = dict(
            data_dir=data_dir,
            database_url=os.environ.get("LIAR_DATABASE_URL", f"sqlite:///{data_dir / 'liar.db'}"),
            broker_url=os.environ.get("LIAR_BROKER_URL", "filesystem://"),
            lease_seconds=float(os.environ.get("LIAR_LEASE_SECONDS", 60)),
            max_attempts=int(os.environ.get("LIAR_MAX_ATTEMPTS", 2)),
            data_roots=_paths(os.environ.get("LIAR_DATA_ROOTS", "")),
            task_dirs=_paths(os.environ.get("LIAR_TASK_DIRS", "")),
            downloads=os.environ.get("LIAR_DOWNLOADS", "all").strip().lower() or "all",
            offline=offline_from_env(),
            worker_class=os.environ.get("LIAR_WORKER_CLASS", "cpu").strip().lower() or "cpu",
            stage_pause=tuple(
                (stage.strip(), float(seconds))
                for stage, _, seconds in (p.partition("=") for p in os.environ.get("LIAR_STAGE_PAUSE", "").split(","))
                if stage.strip()
            ),
            queues=parse_queues(os.environ.get("LIAR_QUEUES", "")),
            stall_minutes=float(os.environ.get("LIAR_STALL_MINUTES", 60)),
            task_time_limit_hours=float(os.environ.get("LIAR_TASK_TIME_LIMIT") or 0) or None,
            store_url=os.environ.get("LIAR_STORE", "").strip() or None,
            store_endpoint=os.environ.get("LIAR_STORE_ENDPOINT", "").strip() or None,
            presign=os.environ.get("LIAR_STORE_PRESIGN", "1").strip().lower() not in ("0", "false", "no"),
            retention_days=float(os.environ.get("LIAR_RETENTION_DAYS") or 0) or None,
            checkpoint_minutes=_duration("LIAR_CHECKPOINT_MINUTES", 5),
            stop_seconds=_duration("LIAR_STOP_SECONDS", 60),
        )
        values.update(overrides)
        from core.pipeline.estimate import WORKERS  # (torch-free)

        if values["worker_class"] not in WORKERS:
            raise ValueError(f"LIAR_WORKER_CLASS is {values['worker_class']!r}; use one of {', '.join(WORKERS)}")
        if values["downloads"] not in DOWNLOAD_POLICIES:
            raise ValueError(f"LIAR_DOWNLOADS is {values['downloads']!r}; use one of {', '.join(DOWNLOAD_POLICIES)}")
        settings = cls(**values)
        settings.store()  # a store that cannot be reached by this URL is said at start, in one sentence
        return settings

    def store(self) -> Store:
        """The store these settings name (``jobs.store``), made once per process."""
        url = self.store_url or str(self.data_dir)
        return _store(url, self.data_dir / "cache", self.presign, self.store_endpoint, os.getpid())

    @property
    def artifacts_dir(self) -> Path:
        return self.data_dir / "artifacts"

    @property
    def uploads_dir(self) -> Path:
        return self.data_dir / "uploads"

    @property
    def models_dir(self) -> Path:
        return self.data_dir / "models"

    @property
    def texts_dir(self) -> Path:
        return self.data_dir / "texts"

    def readable_roots(self) -> list[Path]:
        """Folders whose files a web or API submission may name: the uploads, the bundled models and
        texts (``liar app`` makes a demo of each there), the benchmarks' cache and ``LIAR_DATA_ROOTS``.
        Not the rest of the data dir: the database, the broker's messages and every job's artifacts
        live there (a job's checkpoint is named by its id instead, ``model: job:42``). The CLI on
        one's own machine is not confined."""
        roots = (self.uploads_dir, self.models_dir, self.texts_dir, self.cache_dir, *self.data_roots)
        return [r.resolve() for r in roots]

    @property
    def cache_dir(self) -> Path:
        """The benchmarks' cache of models and texts (``LIAR_CACHE``), named ``cache/…`` (``jobs.names``)."""
        return Path(os.environ.get("LIAR_CACHE", Path.home() / ".cache" / "liar")).expanduser()

    @property
    def broker_dir(self) -> Path:
        return self.data_dir / "broker"

    def ensure_dirs(self) -> None:
        for d in (
            self.data_dir,
            self.artifacts_dir,
            self.broker_dir / "queue",
            self.broker_dir / "control",
            self.broker_dir / "processed",
        ):
            d.mkdir(parents=True, exist_ok=True)
