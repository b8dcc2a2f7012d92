"""The "Workers" tab: the live workers, their queues, device and memory, the job each runs and when
each last answered (content: ``app.web.workers``).

Asking the workers is a broadcast that waits about a second for answers, so the table refreshes only
while the tab is shown: its timer starts when the tab is selected and stops when another tab is.
"""

from __future__ import annotations

import gradio as gr

from app.web import workers
from jobs.service import JobService

REFRESH_SECONDS = 5.0
LABEL = "Workers"


def build(service: JobService, tabs: gr.Tabs) -> None:
    """Add the tab to ``tabs`` (inside its ``with`` block) with its components and events."""
    roster = workers.Roster()
    with gr.Tab(LABEL, id="workers") as tab:
        note = gr.Markdown("Open this tab to ask the workers.", elem_id="workers-note")
        table = gr.Dataframe(headers=workers.COLUMNS, interactive=False, label="Workers", elem_id="workers-table")
        refresh_btn = gr.Button("Refresh")
    timer = gr.Timer(REFRESH_SECONDS, active=False)

    def refresh():
        import pandas as pd

        text, rows = workers.worker_view(service.celery, roster)
        return text, pd.DataFrame(rows, columns=workers.COLUMNS)

    def shown(evt: gr.SelectData):
        """The timer runs while this tab is the selected one."""
        return gr.Timer(active=evt.value == LABEL)

    tabs.select(shown, None, [timer], api_name=False)
    gr.on([tab.select, timer.tick, refresh_btn.click], refresh, None, [note, table], api_name=False)
