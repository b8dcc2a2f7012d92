"""A refused API action is one line in the server's log (who, what, which job, the sentence), not
Gradio's traceback; the caller still gets the one sentence (``app.web.api.answered``)."""

from __future__ import annotations

from urllib.parse import urlsplit

import pytest
import yaml

from tests.app.conftest import PASSWORDS

pytestmark = pytest.mark.integration  # a running app


def _client(url: str, user: str):
    from gradio_client import Client

    return Client(url, auth=(user, PASSWORDS[user]), verbose=False)


def test_a_refusal_is_one_line_in_the_log(team):
    url, data = team["url"], team["data"]
    log = data.parent / f"app-{urlsplit(url).port}.log"  # tests.app.conftest.Launch writes it there
    recipe = {
        "model": str(team["model"]),
        "ratio": 0.3,
        "calibration": {"dataset": str(data / "texts" / "tiny-demo.txt")},
    }
    job = _client(url, "bob").predict(yaml.safe_dump(recipe), api_name="/submit")["id"]
    carol = _client(url, "carol")
    before = log.read_text()
    said = []
    for endpoint, action in (("/cancel_job", "cancel"), ("/delete_job", "delete")):
        with pytest.raises(Exception) as refused:
            carol.predict(job, api_name=endpoint)
        said.append(str(refused.value))
        assert f"job {job} is bob's: only its owner or an administrator may {action} it" in said[-1]
    with pytest.raises(Exception) as missing:
        carol.predict(99999, api_name="/show_job")
    assert "no job 99999" in str(missing.value)
    new = log.read_text()[len(before) :]
    refusals = [line.split(" refused: ", 1)[1] for line in new.splitlines() if " refused: " in line]
    owner = "only its owner or an administrator may"
    assert refusals == [
        f"carol cancel job {job}: job {job} is bob's: {owner} cancel it",
        f"carol delete job {job}: job {job} is bob's: {owner} delete it",
        "carol show job 99999: no job 99999",
    ], new
    assert "Traceback" not in new and "gradio.exceptions.Error" not in new, new
