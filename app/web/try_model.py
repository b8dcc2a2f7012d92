"""The Model page's prompt box: greedy text from the job's pruned checkpoint and from its dense model,
side by side, with each one's tokens/s, generated on a worker of the job's queue (``jobs.generation``).

Also the named API endpoint ``/generate`` (the answer as JSON), under the rules of a download."""

from __future__ import annotations

import json
from typing import Any

import gradio as gr

from app.web.forms import shown
from jobs import generation
from jobs.access import OPEN, Actor
from jobs.service import JobService

NOTHING = ("", "", "")


def speed_line(answer: dict[str, Any]) -> str:
    """Each side's tokens/s (tokens in seconds), and the pruned model's speed against the dense one's."""
    parts = []
    for side, name in (("pruned", "pruned"), ("dense", "dense")):
        a = answer.get(side) or {}
        if "error" in a:
            parts.append(f"**{name}:** ⚠ {a['error']}")
        else:
            parts.append(f"**{name}: {a['tokens_per_s']:.1f} tokens/s** ({a['tokens']} tokens in {a['seconds']:.2f} s)")
    pruned, dense = answer.get("pruned") or {}, answer.get("dense") or {}
    if pruned.get("tokens_per_s") and dense.get("tokens_per_s"):
        parts.append(f"pruned at **{pruned['tokens_per_s'] / dense['tokens_per_s']:.2f}×** the dense speed")
    where = f" · on {answer['worker']}" if answer.get("worker") else ""
    return " · ".join(parts) + f"{where} · greedy, prompt included in the time"


def _text(side: dict[str, Any]) -> str:
    return side.get("text", "") if "error" not in side else ""


def try_it(
    service: JobService, job_id: int | None, prompt: str, tokens: Any, actor: Actor = OPEN, wait: float | None = None
) -> tuple[str, str, str]:
    """(pruned text, dense text, the speed line) for the prompt box; a refusal's sentence in place of
    the speed line, both texts empty."""
    from app.web.views import _refusal

    if job_id is None:
        return "", "", shown("pick a job first")
    try:
        answer = generation.request(service, job_id, prompt, tokens, actor, wait)
    except Exception as exc:
        return "", "", _refusal(exc, f"generate from job {job_id}")
    return _text(answer["pruned"]), _text(answer["dense"]), speed_line(answer)


def build(service: JobService, login, page_id) -> None:
    """The prompt box on the Model page (emptied when the page's job changes), and its API endpoint."""
    from app.web.views import job_id_of

    gr.Markdown("### Try it\n\nThe same prompt, greedy, from the pruned checkpoint and from its dense model.")
    with gr.Row():
        prompt = gr.Textbox(
            label="Prompt", lines=2, scale=4, elem_id="try-prompt", max_length=generation.MAX_PROMPT_CHARS
        )
        tokens = gr.Number(
            generation.DEFAULT_NEW_TOKENS,
            label="New tokens",
            precision=0,
            info=f"1 to {generation.MAX_NEW_TOKENS}",
            scale=1,
            elem_id="try-tokens",
        )
        button = gr.Button("Generate", scale=1, elem_id="try-button")
    with gr.Row():
        pruned = gr.Textbox(label="Pruned checkpoint", lines=4, interactive=False, elem_id="try-pruned")
        dense = gr.Textbox(label="Dense model", lines=4, interactive=False, elem_id="try-dense")
    speed = gr.Markdown(elem_id="try-speed")

    def go(job_id, text, number, request: gr.Request = None):
        return try_it(service, job_id_of(job_id), text, number, login.actor(request))

    button.click(go, [page_id, prompt, tokens], [pruned, dense, speed], api_name=False)
    prompt.submit(go, [page_id, prompt, tokens], [pruned, dense, speed], api_name=False)
    page_id.change(lambda _: NOTHING, [page_id], [pruned, dense, speed], api_name=False)
    api(service, login)


def api(service: JobService, login) -> None:
    """The named endpoint ``/generate`` (``app.web.api``'s conventions)."""
    from app.web.api import answered

    @answered
    def api_generate(
        job_id: float, prompt: str, max_new_tokens: float = generation.DEFAULT_NEW_TOKENS, request: gr.Request = None
    ) -> str:
        """Greedy text from a finished job's checkpoint and from its dense model, on a worker of the
        job's queue, as a JSON object: ``pruned`` and ``dense`` (``text``, ``tokens``, ``seconds``,
        ``tokens_per_s``, or ``error``), ``prompt``, ``max_new_tokens`` (1 to 256) and ``worker``.
        For whoever may download the job's files; refused in one sentence when no worker answers in time."""
        return json.dumps(generation.request(service, int(job_id), prompt, max_new_tokens, login.actor(request)))

    gr.api(api_generate, api_name="generate")
