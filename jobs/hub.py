"""Whether a Hugging Face Hub model id exists, asked of the Hub at submission time.

A nonexistent or private id used to validate and then fail on the worker after it was queued. When
this server can reach the Hub (neither ``LIAR_OFFLINE`` nor ``HF_HUB_OFFLINE`` is set), a submission
naming a hub id asks the Hub's model API once (``HF_ENDPOINT``, with ``HF_TOKEN`` if set): a 404 or
401 means the workers, which use the same token, cannot download it either, and the submission is
refused with that sentence. A Hub that does not answer in time tells nothing: the submission goes
on and the worker reports what it finds. Answers are kept for a few minutes, so a sweep's cells (and
a form validated again and again) ask once.
"""

from __future__ import annotations

import json
import os
import re
import time
import urllib.error
import urllib.parse
import urllib.request

TIMEOUT = 5.0  # seconds the Hub has to answer
KEEP = 300.0  # seconds an answer is reused
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*(/[A-Za-z0-9][\w.-]*)?")  # owner/name, or a bare name
_answers: dict[tuple[str, str], tuple[float, str | None]] = {}


def _endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def missing_model(model_id: str) -> str | None:
    """One sentence when the Hub says ``model_id`` does not exist or is not readable with this
    server's token; None when it exists, or when the Hub cannot be asked (offline, no answer)."""
    if _offline() or not HUB_ID.fullmatch(model_id):  # a path is not asked about
        return None
    key = (_endpoint(), model_id)
    kept = _answers.get(key)
    if kept is not None and time.monotonic() - kept[0] < KEEP:
        return kept[1]
    answer = _ask(model_id)
    _answers[key] = (time.monotonic(), answer)
    return answer


def _ask(model_id: str) -> str | None:
    url = f"{_endpoint()}/api/models/{urllib.parse.quote(model_id, safe='/')}"
    request = urllib.request.Request(url, headers={"User-Agent": "liar-submission-check"})
    token = os.environ.get("HF_TOKEN") or os.environ.get("HUGGING_FACE_HUB_TOKEN")
    if token:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=TIMEOUT) as response:
            json.loads(response.read() or b"{}")  # an answer from the Hub, not a captive portal's page
            return None
    except urllib.error.HTTPError as exc:
        if exc.code in (401, 404):
            private = " or private (the workers read the Hub with HF_TOKEN)" if not token else ""
            return f"model {model_id!r} is not on the Hugging Face Hub{private}: check the id's spelling"
        if exc.code == 403:
            return f"model {model_id!r} is gated on the Hugging Face Hub: accept its terms with the token's account"
        return None
    except (OSError, ValueError):  # no answer, or not the Hub's: the worker will tell
        return None
