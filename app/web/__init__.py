"""The Gradio web app: new run, jobs, dashboard, model page — a thin layer over ``jobs.service``.

One module per tab (``new_run``, ``jobs_tab``, ``dashboard``, ``model_page``) plus the named API
endpoints (``api``: ``/submit``, ``/list_jobs``, ``/show_job``, ``/cancel_job``, ``/download``) and the
checkpoint download routes served beside them (``downloads``: ``jobs/N/files/NAME``,
``jobs/N/checkpoint.tar``); what they do is in ``forms`` (New run), ``views`` (Jobs, Model) and
``charts`` (the dashboard's Vega-Lite charts), as plain functions without Gradio; the Workers tab
(``workers_tab``, content in ``workers``) and the open ``GET /healthz`` (``health``) are the
operator's. ``?job=N`` opens a job's model page (the charts' points link there). Gradio is imported
when the app is built, so those modules load without it (and nothing here loads torch).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gradio as gr

    from app.web.auth import Login
    from app.web.throttle import Throttle
    from jobs.service import JobService

__all__ = ["build_app", "launch"]

TITLE = "LIAR — retraining-free pruning"
# a box's message (new_run: "field-error") in the error colour, where its help line was; a disabled button
# grey and faded (a disabled "stop" button kept its pink and looked usable); the recipe viewer's line numbers
# (app.web.views.numbered_yaml) in a column of their own, left out of a selection
CSS = """
.field-error .info-text, .field-error.prose, .field-error p { color: var(--error-text-color, #b91c1c) !important; }
.field-error .info-text { font-weight: 600; }
button:disabled { background: var(--neutral-200) !important; border-color: var(--neutral-300) !important;
  color: var(--neutral-600) !important; opacity: 0.55; cursor: not-allowed !important; box-shadow: none !important; }
.recipe-view { display: grid; grid-template-columns: max-content 1fr; column-gap: 0.8em; margin: 0;
  padding: 0.5em; border: 1px solid var(--border-color-primary); border-radius: var(--radius-md);
  font-family: var(--font-mono); font-size: var(--text-sm); white-space: pre; overflow-x: auto; }
.recipe-ln { color: var(--body-text-color-subdued); text-align: right; user-select: none; }
"""


def build_app(
    service: JobService | None = None,
    default_models: list[str] | None = None,
    default_texts: list[str] | None = None,
    eval_texts: list[str] | None = None,
    login: Login | None = None,
) -> gr.Blocks:
    """The whole app as a ``gr.Blocks`` (not started); the lists fill the form's pickers; ``login``
    tells who may do what (open when None)."""
    import gradio as gr

    from app.web import api, dashboard, forms, header, jobs_tab, model_page, new_run, workers_tab
    from app.web.auth import Login
    from jobs.service import JobService

    service = service or JobService()
    login = login or Login()
    named = lambda values: [service.names.name(v) for v in values or []]  # noqa: E731 - models/NAME, no path
    models, texts, eval_texts = named(default_models), named(default_texts) + forms.NAMED_SETS, named(eval_texts)
    with gr.Blocks(title=TITLE, analytics_enabled=False) as demo:
        header.build(demo, login)
        with gr.Tabs() as tabs:
            with gr.Tab("New run", id="new"):
                new_run.build(demo, service, models, texts, eval_texts, login)
            with gr.Tab("Jobs", id="jobs"):
                picked, open_picked = jobs_tab.build(service, login)
            with gr.Tab("Dashboard", id="dashboard") as dashboard_tab:
                runs = dashboard.build(service, demo, dashboard_tab)
            with gr.Tab("Model", id="model"):
                page_id = model_page.build(service, login)
            workers_tab.build(service, tabs)
        api.build(service, login)
        model_page.openers(demo, tabs, page_id, picked, open_picked, runs)
    return demo


def launch(
    host: str = "127.0.0.1", port: int = 7860, login: Login | None = None, throttle: Throttle | None = None, **kwargs
) -> None:
    """Serve the app, with ``login`` (``app.web.auth``: accounts with hashed passwords, or a trusted
    proxy's header; open when None) behind its front door (``app.web.gate``: logged out, only the
    login page answers; failed logins are throttled by ``throttle``, from the environment when None)."""
    import gradio as gr
    from starlette.middleware import Middleware

    from app.web import downloads, health
    from app.web.auth import Login
    from app.web.forms import MAX_UPLOAD_MB
    from app.web.gate import Gate
    from app.web.throttle import Throttle
    from jobs.service import JobService

    login = login or Login()
    throttle = (throttle or Throttle.from_env()) if login.mode == "passwords" else None
    service = JobService()
    demo = build_app(service, login=login, **kwargs)
    print(f"LIAR app on http://{host}:{port}  (data: {service.settings.data_dir})", flush=True)
    # system fonts only: the default theme would fetch web fonts from the internet
    theme = gr.themes.Default(
        font=["ui-sans-serif", "system-ui", "sans-serif"], font_mono=["ui-monospace", "monospace"]
    )
    demo.queue().launch(
        theme=theme,
        css=CSS,
        server_name=host,
        server_port=port,
        auth=login.check_password if login.mode == "passwords" else None,
        auth_dependency=login.proxy_user if login.mode == "proxy" else None,
        show_error=False,  # an unexpected exception shows as "Error": app.web.api says what it can, with an id
        allowed_paths=[str(service.settings.data_dir / "recipes")],
        max_file_size=f"{MAX_UPLOAD_MB}mb",  # refused by the server before it is stored
        quiet=True,
        prevent_thread_lock=True,
        app_kwargs={"middleware": [Middleware(Gate, login=login, throttle=throttle)]},
    )
    downloads.attach(demo.server_app, service, login)  # checkpoints: plain HTTP
    health.attach(demo.server_app, service)  # GET /healthz, open: a load balancer's probe has no login
    demo.block_thread()
