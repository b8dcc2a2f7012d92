"""The app's header: its title, and with login on, who is logged in and the way out."""

from __future__ import annotations

import gradio as gr

from app.web.auth import Login

HEADER = (
    "# LIAR · retraining-free structured pruning\nPrune heads and neurons, rebuild the "
    "pruned layers by least squares, download a loadable checkpoint."
)


def signed_in_line(login: Login, request: gr.Request | None) -> str:
    """``Signed in as alice (administrator) · Log out``."""
    actor = login.actor(request)
    role = " (administrator)" if actor.admin else ""
    return f"Signed in as **{actor}**{role} · [Log out](logout)"


def build(demo: gr.Blocks, login: Login) -> None:
    """The header row, inside ``demo``."""
    with gr.Row():
        gr.Markdown(HEADER)
        if login.required:
            signed_in = gr.Markdown(elem_id="signed-in")

            def who(request: gr.Request):
                return signed_in_line(login, request)

            demo.load(who, None, signed_in, api_name=False)
