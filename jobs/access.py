"""Who may do what to a job, and the text a refusal or a failure shows its users.

Everyone on a team sees every job, the dashboard and the model pages: that is what a team dashboard
is for. Changing a job (cancel it, re-run it as a new job, delete it with its files) is for its owner
(the account that submitted it) and for administrators; downloading its files too, when the server
restricts downloads (``LIAR_DOWNLOADS=owners``). The rules live here, once, and
:class:`jobs.service.JobService` applies them for every route: the web app, its API, the job
payloads. Without a login there is nobody to tell apart: every caller is :data:`OPEN`, as is the
operator's ``liar jobs`` command, which talks to the database directly (whoever holds the database
URL holds every job anyway).

Users never see a traceback, an absolute server path, a class name or a credential: :func:`public_error`
turns an unexpected exception into one sentence with an error id, and the full detail goes to the
server's log under that id (:func:`log_failure`).
"""

from __future__ import annotations

import logging
import re
import uuid
from dataclasses import dataclass

logger = logging.getLogger("liar.errors")


@dataclass(frozen=True)
class Actor:
    """Who asks: an account (``name``), and whether it administers the server."""

    name: str | None
    admin: bool = False

    def __str__(self) -> str:
        return self.name or "anonymous"


OPEN = Actor(None, admin=True)  # login off, or the operator at the database: nobody to tell apart


class Forbidden(PermissionError):
    """The actor may not do this to the job; the message says why, in one sentence."""


class NotNow(ValueError):
    """The action does not apply to the job as it is (deleting a running job); nothing changed."""


def may_change(actor: Actor, owner: str | None) -> bool:
    """Whether ``actor`` may cancel, re-run or delete (or, when downloads are restricted, download)
    a job submitted by ``owner``. A job nobody owns (submitted with login off) is the admins'."""
    return actor.admin or (actor.name is not None and actor.name == owner)


def require_owner(actor: Actor, job_id: int, owner: str | None, action: str) -> None:
    """Raise :class:`Forbidden` unless :func:`may_change`."""
    if not may_change(actor, owner):
        whose = f"{owner}'s" if owner else "nobody's (submitted without a login)"
        raise Forbidden(f"job {job_id} is {whose}: only its owner or an administrator may {action} it")


# --- what users see of a failure -------------------------------------------------------------------

# a credential in a URL (``redis://:secret@host``, ``postgresql://user:pw@host``)
_URL_SECRET = re.compile(r"\b([a-z][a-z0-9+.\-]*://)[^\s/@:]*:[^\s/@]*@", re.I)
# an absolute POSIX path of two or more parts (``/srv/liar/data/uploads/4ae1.jsonl``); not a URL's path
_ABS_PATH = re.compile(r"(?<![\w.:/~\-])/(?:[\w.+@%~\-]+/)+([\w.+@%~\-]*)")
# ``RuntimeError: …``, ``torch.OutOfMemoryError: …``, at the start, after a colon ("failed: ValueError: …")
# or an opening parenthesis ("could not load it (OSError: …)")
_CLASS_PREFIX = re.compile(
    r"(?:^|(?<=: )|(?<=\())(?:[A-Za-z_]\w*\.)*[A-Z]\w*(?:Error|Exception|Warning|Exit|Interrupt)\b:?\s*"
)
_CLASS_SUFFIX = re.compile(r"(?:Error|Exception|Warning|Exit|Interrupt)$")
# a class named alone in parentheses: "Couldn't reach 'wikitext' on the Hub (OfflineModeIsEnabled)"
_CLASS_ALONE = re.compile(r"\s*\((?:[A-Za-z_]\w*\.)*([A-Z]\w*)\)")


def new_error_id() -> str:
    return uuid.uuid4().hex[:10]


def scrub_text(text: str, replacements: dict[str, str] | None = None) -> str:
    """``text`` without credentials in URLs and without absolute server paths: ``replacements`` first
    (a server path → what the user knows it as, e.g. an upload's stored copy → the name it was
    uploaded under), then every remaining absolute path shortened to its last part."""
    for server, known in (replacements or {}).items():
        if server:
            text = text.replace(server, known)
    text = _URL_SECRET.sub(r"\1***@", text)
    return _ABS_PATH.sub(lambda m: m.group(1) or "…", text)


def _exception_names() -> set[str]:
    """The names of the exception classes this process has loaded (the Hub's ``OfflineModeIsEnabled``
    is one, though its name does not say so)."""
    names, todo = set(), [BaseException]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def _without_named_classes(text: str) -> str:
    """``text`` without "(SomeClass)" where SomeClass names an exception class."""
    found = _CLASS_ALONE.findall(text)
    if not found:
        return text
    known = _exception_names() if not all(_CLASS_SUFFIX.search(name) for name in found) else set()
    return _CLASS_ALONE.sub(lambda m: "" if m[1] in known or _CLASS_SUFFIX.search(m[1]) else m[0], text)


def public_text(text: str) -> str:
    """A stored error or log line as users may see it: scrubbed (:func:`scrub_text`), on one line,
    without Python class names, wherever a library put them (rows written before errors were made
    public have them too)."""
    text = _without_named_classes(" ".join(scrub_text(text).split()))
    return _CLASS_PREFIX.sub("", text).strip()


def public_message(exc: BaseException) -> str:
    """An exception's message as users may see it (:func:`public_text`); the class's readable name
    if the message is empty."""
    text = public_text(str(exc))
    if not text:
        text = re.sub(r"(?<!^)(?=[A-Z])", " ", type(exc).__name__).lower()
    return text


def log_failure(error_id: str, context: str, exc: BaseException) -> None:
    """The full detail of a failure (traceback included) in the server's log, under its id."""
    logger.error("error %s: %s", error_id, context, exc_info=(type(exc), exc, exc.__traceback__))


def public_error(exc: BaseException, context: str) -> str:
    """One sentence for a failure users see (a job's error, an API answer): what went wrong without
    server internals, and the id under which :func:`log_failure` put the detail in the server log."""
    error_id = new_error_id()
    log_failure(error_id, context, exc)
    return f"{public_message(exc)} (error id {error_id}; the server log has the details)"
