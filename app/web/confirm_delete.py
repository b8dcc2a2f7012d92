"""The Jobs tab's Delete, asked in the page first: the click shows what goes (the checkpoint, its size,
its exports: ``views.delete_question``) with a button that names the job, and nothing is removed until
that one is clicked. A refusal (not the owner, not finished) is said at once, with nothing asked.

Once deleted, the job is no longer the picked one: the panel goes back to "select a job", and the
message says what was removed (never a "no job" beside it)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gradio as gr

from app.web import views
from app.web.auth import Login
from app.web.forms import Status
from jobs.service import JobService


class DeleteQuestion:
    """The question's components, made where the tab places them (below its buttons), hidden until
    Delete is clicked; :meth:`wire` connects them."""

    def __init__(self):
        self.asked = gr.State(None)  # the job the question is about (the picked one may change meanwhile)
        with gr.Group(visible=False, elem_id="delete-question") as self.box:
            self.question = gr.Markdown(elem_id="delete-question-text")
            with gr.Row():
                self.confirm = gr.Button("Delete", variant="stop", elem_id="delete-confirm")
                self.keep = gr.Button("Keep it", elem_id="delete-keep")

    def wire(
        self,
        service: JobService,
        login: Login,
        delete_btn: gr.Button,
        picked: gr.State,
        message: gr.Markdown,
        view: Callable[[Any], list],
        panel: list,
    ) -> list:
        """Ask on ``delete_btn``, delete on the confirmation; ``view(job_id)`` gives the values of
        ``panel`` (the job panel and its buttons) for a job, or for none. Returns the event that ends in
        a deletion, for the tab to refresh its table after."""
        box, asked = self.box, self.asked

        def ask(job_id, request: gr.Request = None):
            text = views.delete_question(service, job_id, login.actor(request))
            if isinstance(text, Status):  # refused, or nothing picked: said, nothing asked
                return gr.Group(visible=False), "", gr.skip(), None, text
            job_id = views.job_id_of(job_id)
            return gr.Group(visible=True), text, gr.Button(value=f"Delete job {job_id} and its files"), job_id, ""

        def delete(job_id, request: gr.Request = None):
            said = views.delete_job(service, job_id, login.actor(request))
            if isinstance(said, Status):  # refused after all (deleted from elsewhere meanwhile)
                return gr.Group(visible=False), None, said, *(gr.skip() for _ in (picked, *panel))
            return gr.Group(visible=False), None, said, None, *view(None)  # no longer picked: no panel of it

        def keep_it(job_id):
            return gr.Group(visible=False), None, f"job {job_id} kept" if job_id else ""

        delete_btn.click(ask, [picked], [box, self.question, self.confirm, asked, message], api_name=False)
        done = self.confirm.click(delete, [asked], [box, asked, message, picked, *panel], api_name=False)
        self.keep.click(keep_it, [asked], [box, asked, message], api_name=False)
        return [done]
