"""``liar jobs … --server URL``: the job commands against a running app, through its API, as an
account of it. The server applies its rules (``jobs.access``): the account may submit, see every job,
and cancel, re-run, re-evaluate or delete its own (an administrator's, anyone's). Without ``--server``
the commands talk to the database directly, as its operator.

The account: ``LIAR_SERVER_USER`` (else ``$USER``) and ``LIAR_SERVER_PASSWORD`` (else asked for,
without echo, when there is a terminal). An app with no login needs neither.
"""

from __future__ import annotations

import getpass
import json
import os
import sys
from typing import Any

import yaml


class RemoteError(Exception):
    """What the server (or reaching it) said, in one sentence."""


def _credentials() -> tuple[str, str] | None:
    user = os.environ.get("LIAR_SERVER_USER") or os.environ.get("USER")
    password = os.environ.get("LIAR_SERVER_PASSWORD")
    if password is None and user and sys.stdin.isatty():
        password = getpass.getpass(f"password for {user}: ")
    return (user, password) if user and password else None


def _log_in(url: str, credentials: tuple[str, str]) -> dict[str, str]:
    """The login's cookies, from the app's ``/login`` (as ``gradio_client`` would log in, but keeping
    the server's sentence: a throttled login says when to try again)."""
    import httpx

    address = url if url.endswith("/") else url + "/"
    try:
        answer = httpx.post(address + "login", data={"username": credentials[0], "password": credentials[1]})
    except httpx.HTTPError as exc:
        raise RemoteError(f"cannot use the server at {url}: {exc}") from None
    if answer.status_code == 429:
        raise RemoteError(f"cannot use the server at {url}: {_detail(answer)}")
    if answer.status_code == 400:
        raise RemoteError(f"cannot use the server at {url}: the login was refused (wrong account or password)")
    return {name: value for name, value in answer.cookies.items() if value is not None}


def _detail(answer) -> str:
    try:
        return str(answer.json()["detail"])
    except (ValueError, KeyError, TypeError):
        return f"the login was refused (HTTP {answer.status_code})"


class RemoteJobs:
    """The subset of ``JobService`` the ``liar jobs`` commands use, over a server's named endpoints."""

    def __init__(self, url: str):
        from gradio_client import Client

        credentials = _credentials()
        cookies = _log_in(url, credentials) if credentials else {}
        try:
            self.client = Client(url, verbose=False, httpx_kwargs={"cookies": cookies})
        except Exception as exc:  # unreachable, a login needed, not a LIAR app: one line
            reason = "the login was refused" if "401" in str(exc) or "auth" in str(exc).lower() else str(exc)
            raise RemoteError(f"cannot use the server at {url}: {reason}") from None

    def _call(self, endpoint: str, *args: Any) -> Any:
        try:
            return self.client.predict(*args, api_name=endpoint)
        except Exception as exc:  # the server's refusal or error, already one sentence
            raise RemoteError(str(exc).strip() or f"{endpoint} failed") from None

    def submit(self, recipe: dict | str, submitted_by: str | None = None, evaluations: list[dict] | None = None) -> int:
        text = yaml.safe_dump(recipe, sort_keys=False) if isinstance(recipe, dict) else _read(recipe)
        ppl = next((e for e in evaluations or [] if e["type"] == "perplexity"), None)
        tasks = next((e for e in evaluations or [] if e["type"] == "lm_eval"), None)
        if tasks and (tasks.get("limit") or tasks.get("num_fewshot") is not None):
            raise RemoteError("--task-limit and --num-fewshot are not sent to a server: submit on it, or leave them")
        args = [text, submitted_by or "", ppl["dataset"] if ppl else "", ppl["seq_len"] if ppl else 0]
        args += [tasks["tasks"] if tasks else "", (tasks or {}).get("task_dir") or ""]
        return self._call("/submit", *args)["id"]

    def list(self, status: str | None = None, group_id: str | None = None, submitted_by: str | None = None,
             limit: int = 100) -> list[dict[str, Any]]:  # fmt: skip
        rows = json.loads(self._call("/list_jobs", status or ""))
        rows = [r for r in rows if (not group_id or r["group_id"] == group_id)]
        return [r for r in rows if (not submitted_by or r["submitted_by"] == submitted_by)][:limit]

    def show(self, job_id: int, internal: bool = False) -> dict[str, Any]:
        return json.loads(self._call("/show_job", job_id))

    def cancel(self, job_id: int) -> str:
        return self._call("/cancel_job", job_id)

    def rerun(self, job_id: int, confine: bool = True) -> int:  # the server confines a re-run, whatever is asked
        return self._call("/rerun_job", job_id)["id"]

    def reevaluate(self, job_id: int, evaluations: str | None = None, confine: bool = True) -> int:
        return self._call("/reevaluate_job", job_id, evaluations or "")["id"]  # confined by the server

    def export(self, job_id: int, forms: str | list[str]) -> int:
        return self._call("/export_job", job_id, forms if isinstance(forms, str) else ",".join(forms))["id"]

    def delete(self, job_id: int) -> None:
        self._call("/delete_job", job_id)


def _read(path: str) -> str:
    try:
        with open(path) as f:
            return f.read()
    except OSError as exc:
        raise RemoteError(f"cannot read {path}: {exc.strerror}") from None
