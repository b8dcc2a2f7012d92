"""The guide's ``/download`` example runs against the endpoint's real answer, and the keys the guide
documents are the answer's keys (``app.web.listings.download_listing``, what ``/download`` returns)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from app.web import listings
from tests.app.test_access import _finished

GUIDE = Path(__file__).resolve().parents[2] / "docs" / "guide.md"


def _example() -> str:
    """The guide's lines that call ``/download`` and use its answer (up to the next call)."""
    block = re.search(r"```python\n(from gradio_client import Client.*?)```", GUIDE.read_text(), re.S).group(1)
    lines = block.splitlines()
    start = next(i for i, line in enumerate(lines) if "/download" in line)
    end = next((i for i in range(start + 1, len(lines)) if "c.predict(" in lines[i]), len(lines))
    return "\n".join(lines[start:end])


def test_the_guides_download_example_runs_on_the_answer(job_service, llama_dir, capsys):
    job_id = _finished(job_service, llama_dir, "ada")
    answer = listings.download_listing(job_service, job_id)

    class Client:  # the answer as gradio_client gives it: the endpoint's JSON text
        def predict(self, *args, api_name):
            assert api_name == "/download"
            return json.dumps(answer)

    exec(_example(), {"c": Client(), "job": {"id": job_id}, "json": json})
    printed = capsys.readouterr().out.splitlines()
    assert len(printed) == len(answer["files"]) > 0
    assert printed[0].split()[0] == answer["files"][0]["name"]


def test_the_guide_documents_the_answers_keys(job_service, llama_dir):
    answer = listings.download_listing(job_service, _finished(job_service, llama_dir, "ada"))
    text = GUIDE.read_text()
    paragraph = text[text.index("`/download` answers") :].split("\n\n")[0]
    documented = set(re.findall(r"`(\w+)`", paragraph))
    assert set(answer) <= documented
    assert set(answer["files"][0]) <= documented
