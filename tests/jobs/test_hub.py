"""The submission-time Hub check (``jobs.hub``) against a local stand-in for the Hub's model API."""

from __future__ import annotations

import http.server
import json
import threading

import pytest

from jobs import hub


class _Hub(http.server.BaseHTTPRequestHandler):
    known = {"org/real-model"}
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 (http.server's name)
        _Hub.seen.append((self.path, self.headers.get("Authorization")))
        name = self.path.removeprefix("/api/models/")
        if name in self.known:
            body, code = json.dumps({"id": name}).encode(), 200
        elif name == "org/gated":
            body, code = b'{"error": "gated"}', 403
        else:
            body, code = b'{"error": "Repository not found"}', 401 if self.headers.get("Authorization") is None else 404
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture()
def fake_hub(monkeypatch):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Hub)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{server.server_address[1]}")
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.delenv("HF_TOKEN", raising=False)
    monkeypatch.delenv("HUGGING_FACE_HUB_TOKEN", raising=False)
    monkeypatch.setattr(hub, "_answers", {})
    _Hub.seen.clear()
    yield server
    server.shutdown()


def test_the_hub_is_asked_once_and_its_answer_becomes_a_sentence(fake_hub, monkeypatch):
    assert hub.missing_model("org/real-model") is None
    assert hub.missing_model("org/no-such-model") == (
        "model 'org/no-such-model' is not on the Hugging Face Hub or private (the workers read the Hub with "
        "HF_TOKEN): check the id's spelling"
    )
    assert "gated" in hub.missing_model("org/gated")
    for _ in range(3):  # a sweep's cells: answered from what was kept
        hub.missing_model("org/no-such-model")
    assert [p for p, _ in _Hub.seen] == ["/api/models/org/real-model", "/api/models/org/no-such-model",
                                         "/api/models/org/gated"]  # fmt: skip
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    monkeypatch.setattr(hub, "_answers", {})
    assert hub.missing_model("org/no-such-model").endswith("is not on the Hugging Face Hub: check the id's spelling")
    assert _Hub.seen[-1] == ("/api/models/org/no-such-model", "Bearer hf_secret")


def test_nothing_is_asked_offline_or_about_a_path_and_silence_tells_nothing(fake_hub, monkeypatch):
    assert hub.missing_model("/models/llama") is None and hub.missing_model("./llama") is None
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert hub.missing_model("org/no-such-model") is None
    assert _Hub.seen == []
    monkeypatch.setenv("HF_HUB_OFFLINE", "0")
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens: the worker will tell
    assert hub.missing_model("org/no-such-model") is None


def test_a_submission_of_a_nonexistent_hub_id_is_refused_at_submit(fake_hub, tmp_path, job_models):
    """The issue's case: a nonexistent hub id validated "✓ valid" and failed on the worker."""
    from jobs.service import SubmitError
    from tests.jobs.conftest import recipe
    from tests.jobs.test_submission import _service

    service = _service(tmp_path, offline=False)
    with pytest.raises(SubmitError, match="'org/no-such-model' is not on the Hugging Face Hub"):
        service.submit(recipe(job_models, model="org/no-such-model"))
    assert service.list() == []
    assert [p for p, _ in _Hub.seen] == ["/api/models/org/no-such-model"]
