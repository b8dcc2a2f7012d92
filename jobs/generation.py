"""Try a pruned model: greedy text from a finished job's checkpoint and from its dense model, side by
side, with each one's tokens/s (the Model page's prompt box and the ``/generate`` API endpoint).

The text is generated on a worker, never in the web process (which stays torch-free and small): the
request is a Celery task, ``liar.generate``, sent to the queue the job ran on (``jobs.routing``: a
worker there had the memory for the job), and the web side waits for its answer a bounded time
(:data:`WAIT_S`, ``LIAR_GENERATE_WAIT``). Workers run one task at a time, so a request waits behind a
running job; when no answer comes in time, the request is withdrawn (revoked, and it expires) and
the caller reads one sentence saying so. The answer travels back through the result backend
``jobs.celery_app`` configures beside the broker (a folder beside the filesystem broker's, or Redis).

Who may: whoever may download the job's files (``LIAR_DOWNLOADS``: everyone, or its owner and the
administrators; ``jobs.access``), since the text shows what the weights do. A bad prompt or token
count is refused in one sentence before anything is sent (:func:`check_request`); the worker checks
again (a message may come from anyone with access to the broker).
"""

from __future__ import annotations

import logging
import os
import socket
from typing import Any

from sqlalchemy import select

from jobs import routing
from jobs.access import OPEN, Actor, NotNow, new_error_id, public_error, public_message, require_owner
from jobs.db import Artifact, Job, Status, connect
from jobs.references import job_reference, local_checkpoint, owner_and_checkpoint
from jobs.settings import Settings, redact_url, scrub
from jobs.submission import SubmitError

logger = logging.getLogger(__name__)

TASK = "liar.generate"
MAX_NEW_TOKENS = 256  # per side: a prompt box, not a benchmark (bench/speed.py measures decoding)
MAX_PROMPT_CHARS = 4000
DEFAULT_NEW_TOKENS = 32
WAIT_S = float(os.environ.get("LIAR_GENERATE_WAIT", 180))  # the web side's wait for a worker's answer


class NoAnswer(NotNow):
    """No worker answered within the wait; the request was withdrawn and nothing changed."""


def check_request(prompt: object, max_new_tokens: object) -> tuple[str, int]:
    """The prompt and the token count, checked; :class:`SubmitError` in one sentence otherwise."""
    if not isinstance(prompt, str) or not prompt.strip():
        raise SubmitError("the prompt is empty: type a few words for both models to continue")
    if len(prompt) > MAX_PROMPT_CHARS:
        raise SubmitError(f"the prompt has {len(prompt):,} characters; at most {MAX_PROMPT_CHARS:,} are allowed")
    number = max_new_tokens
    if isinstance(number, float) and number.is_integer():
        number = int(number)
    if isinstance(number, str) and number.strip().isdigit():
        number = int(number.strip())
    if isinstance(number, bool) or not isinstance(number, int) or not 1 <= number <= MAX_NEW_TOKENS:
        raise SubmitError(f"tokens: a whole number from 1 to {MAX_NEW_TOKENS}, not {max_new_tokens!r}")
    return prompt, number


def _queue_of_checkpoint(service, job_id: int, actor: Actor) -> str | None:
    """The queue the job ran on, once it is known that ``actor`` may read its checkpoint and that
    there is one; refusals (``KeyError``, ``Forbidden``, :class:`NotNow`) in one sentence."""
    with service.sessions() as s:
        job = s.get(Job, job_id)
        if job is None:
            raise KeyError(f"no job {job_id}")
        if service.settings.downloads == "owners":
            require_owner(actor, job_id, job.submitted_by, "generate from")
        if job.status != Status.SUCCEEDED.value:
            raise NotNow(f"job {job_id} is {job.status}: only a finished job's checkpoint can generate text")
        kinds = set(s.scalars(select(Artifact.kind).where(Artifact.job_id == job_id)))
        if "checkpoint" not in kinds:
            raise NotNow(f"job {job_id} wrote no checkpoint of its own: try the job whose checkpoint it used")
        checkpoint = local_checkpoint(s, service.settings.store(), job_id, weights=False)
        if checkpoint is None:
            raise NotNow(f"job {job_id}'s checkpoint is no longer on the server")
        queue = job.queue
    from core.pipeline.preflight import model_kind  # (torch-free: the config only)

    kind = model_kind(str(checkpoint))
    if kind is not None and kind[0] != "decoder":
        raise NotNow(f"job {job_id}'s model is an {kind[0]}: only a causal language model continues a prompt")
    return queue


def request(
    service, job_id: int, prompt: object, max_new_tokens: object, actor: Actor = OPEN, wait: float | None = None
) -> dict[str, Any]:
    """Generate from job ``job_id``'s checkpoint and its dense model on a worker of the job's queue;
    the answer (:func:`answer`). Refusals in one sentence: ``KeyError``, ``Forbidden``,
    :class:`SubmitError`, :class:`NotNow`, and :class:`NoAnswer` when no worker answers within
    ``wait`` seconds (:data:`WAIT_S`)."""
    from celery.exceptions import TimeoutError as CeleryTimeout

    prompt, number = check_request(prompt, max_new_tokens)
    queue = _queue_of_checkpoint(service, job_id, actor)
    wait = WAIT_S if wait is None else wait
    try:
        sent = service.celery.send_task(
            TASK, args=[job_id, prompt, number], expires=wait, **routing.send_options(queue)
        )
    except Exception as exc:  # the broker's URL (a password, a host) stays in the server log
        error_id, url = new_error_id(), service.settings.broker_url
        reason = scrub(str(exc), url) or type(exc).__name__
        logger.error("error %s: the broker at %s did not take a prompt: %s", error_id, redact_url(url), reason)
        raise NotNow(
            "the job broker did not take the prompt, so nothing was generated; try again, or tell the administrator "
            f"(error id {error_id})"
        ) from None
    try:
        result = sent.get(timeout=wait, propagate=False, interval=0.2)
    except CeleryTimeout:
        try:
            sent.revoke()
        except Exception:  # the expiry withdraws it anyway
            pass
        where = f"queue {queue}" if queue else "the job's queue"
        raise NoAnswer(
            f"no worker on {where} answered within {wait:.0f} s (they run one task at a time, so they may be busy "
            "with jobs, or none is running): try again later"
        ) from None
    finally:
        try:
            sent.forget()
        except Exception:
            pass
    if not isinstance(result, dict) or "error" in result:
        error = result.get("error") if isinstance(result, dict) else "the worker gave no answer"
        raise NotNow(error)
    return result


# --- on the worker -------------------------------------------------------------------------------


def _models(settings: Settings, job_id: int) -> tuple[str, str, str, str]:
    """(checkpoint folder, dense model, dtype, device) of the job, on this host."""
    store = settings.store()
    with connect(settings.database_url)() as s:
        job = s.get(Job, job_id)
        if job is None or job.status != Status.SUCCEEDED.value:
            raise NotNow(f"job {job_id} has no finished checkpoint any more")
        checkpoint = local_checkpoint(s, store, job_id)
        if checkpoint is None:
            raise NotNow(f"job {job_id}'s checkpoint is no longer on the server")
        dense = job.recipe["model"]
        reference = job_reference(dense)
        if reference is not None:
            try:
                dense = str(owner_and_checkpoint(s, reference, store)[1])
            except ValueError as exc:
                dense = f"!{exc}"  # said on the dense side only: the pruned side stands
        ran = job.recipe_as_run or job.recipe
        return str(checkpoint), dense, ran.get("dtype", "auto"), ran.get("device", "auto")


def answer(settings: Settings, job_id: int, prompt: object, max_new_tokens: object) -> dict[str, Any]:
    """What the ``liar.generate`` task returns: ``{"job", "prompt", "max_new_tokens", "pruned",
    "dense", "worker"}``, each side :class:`core.evaluation.generate.Generation`'s values, or
    ``{"error": …}`` for a side that failed (the other stands); ``{"error": …}`` alone when nothing
    could be generated. Never raises: the web side reads one sentence."""
    try:
        prompt, number = check_request(prompt, max_new_tokens)
        checkpoint, dense, dtype, device = _models(settings, job_id)
    except (SubmitError, NotNow) as exc:
        return {"error": str(exc)}
    except Exception as exc:
        return {"error": public_error(exc, f"generate from job {job_id}")}
    from core.evaluation.generate import generate_from
    from core.process import configure_engine

    configure_engine()
    out: dict[str, Any] = {"job": job_id, "prompt": prompt, "max_new_tokens": number}
    for side, name in (("pruned", checkpoint), ("dense", dense)):
        if name.startswith("!"):
            out[side] = {"error": f"the dense model cannot be loaded: {name[1:]}"}
            continue
        try:
            out[side] = generate_from(name, prompt, number, dtype, device).as_dict()
        except ValueError as exc:  # said by the loader or the tokenizer, in a sentence
            out[side] = {"error": public_message(exc)}
        except Exception as exc:
            out[side] = {"error": public_error(exc, f"generate from job {job_id}, {side} model")}
    if "error" in out["pruned"] and "error" in out["dense"]:
        return {"error": f"the pruned model: {out['pruned']['error']}"}
    out["worker"] = socket.gethostname()
    return out
