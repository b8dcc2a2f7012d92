"""Offline means offline: the Hub libraries' own switches (``HF_HUB_OFFLINE``, ``HF_DATASETS_OFFLINE``)
refuse at submission what ``LIAR_OFFLINE`` refuses; and what a worker stores of a failure that a Hub
library raised names no Python class (``jobs.access.public_text``)."""

from __future__ import annotations

import re

import pytest

from core.models.tiny import tiny_corpus
from jobs.access import public_text
from jobs.service import JobService, SubmitError
from jobs.settings import Settings, offline_from_env

# a Python class where a user would read it: "OSError: …", "(ConnectionError: …", "(OfflineModeIsEnabled)"
CLASS_NAME = re.compile(r"\b[A-Z]\w*(?:Error|Exception)\b|OfflineModeIsEnabled|HTTPError")


@pytest.mark.parametrize(
    "env, offline",
    [
        ({}, False),
        ({"LIAR_OFFLINE": "1"}, True),
        ({"HF_HUB_OFFLINE": "1"}, True),
        ({"HF_DATASETS_OFFLINE": "true"}, True),
        ({"HF_HUB_OFFLINE": "0", "HF_DATASETS_OFFLINE": ""}, False),
    ],
)
def test_each_offline_switch_makes_the_server_offline(env, offline):
    assert offline_from_env(env) is offline


@pytest.mark.parametrize("switch", ["HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"])
def test_the_hub_switches_refuse_at_submission(switch, tmp_path, llama_dir, monkeypatch):
    for name in ("LIAR_OFFLINE", "HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv(switch, "1")
    data = tmp_path / "data"
    monkeypatch.setenv("LIAR_DATA_DIR", str(data))
    monkeypatch.setenv("LIAR_BROKER_URL", "memory://")
    monkeypatch.delenv("LIAR_DATABASE_URL", raising=False)
    service = JobService(Settings.from_env())
    assert service.settings.offline
    texts = tmp_path / "texts.txt"
    texts.write_text("\n\n".join(tiny_corpus(20)))
    refused = [
        ({"model": "someorg/not-cached-here", "ratio": 0.3, "calibration": {"dataset": str(texts)}}, []),
        ({"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2"}}, []),
        (
            {"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": str(texts)}},
            [{"type": "perplexity", "dataset": "wikitext2", "seq_len": 64}],
        ),
    ]
    for recipe, evaluations in refused:
        with pytest.raises(SubmitError) as caught:
            service.submit(recipe, evaluations=evaluations)
        assert "which this server's workers cannot reach (this server works offline)" in str(caught.value)
    assert service.list() == []


def test_class_names_leave_the_text_users_read():
    """The words users read of a failure a Hub library raised (as the worker got them), without the
    classes: after "(", alone in parentheses, on one line."""
    texts = {
        "could not load the model config of 'x/y' (OSError: We couldn't connect to 'https://huggingface.co' to "
        "load the files.\nCheck your internet connection.). Give a local directory (error id 1)": (
            "could not load the model config of 'x/y' (We couldn't connect to 'https://huggingface.co' to load "
            "the files. Check your internet connection.). Give a local directory (error id 1)"
        ),
        "could not load the named calibration set 'wikitext2' through `datasets` (ConnectionError: Couldn't "
        "reach 'wikitext' on the Hub (OfflineModeIsEnabled)). Without the Hub, pass a local file.": (
            "could not load the named calibration set 'wikitext2' through `datasets` (Couldn't reach 'wikitext' "
            "on the Hub). Without the Hub, pass a local file."
        ),
        "transient error: ConnectionError: the hub hung up": "transient error: the hub hung up",
        "failed after 2 attempts (requests.exceptions.HTTPError)": "failed after 2 attempts",
        "the model (SmolLM2) has 30 layers (LayerNorm)": "the model (SmolLM2) has 30 layers (LayerNorm)",
    }
    import huggingface_hub.errors  # noqa: F401 - the Hub's classes, loaded as on a worker

    for stored, shown in texts.items():
        assert public_text(stored) == shown


def test_a_worker_failure_from_the_hub_reads_as_plain_words(tmp_path, llama_dir, monkeypatch):
    """Jobs a server that thinks it is online accepted (its workers offline: HF_HUB_OFFLINE,
    HF_DATASETS_OFFLINE) fail on the worker; the error and log lines users see name no class."""
    from jobs.tasks import execute

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    data = tmp_path / "data"
    settings = Settings(data_dir=data, database_url=f"sqlite:///{data / 'liar.db'}", broker_url="memory://",
                        max_attempts=1, data_roots=(tmp_path,))  # fmt: skip
    settings.ensure_dirs()
    service = JobService(settings)
    texts = tmp_path / "texts.txt"
    texts.write_text("\n\n".join(tiny_corpus(20)))
    small = {"num_calibration_samples": 4, "max_seq_length": 16, "holdout_samples": 0, "batch_size": 2}
    hub_model = {"model": "someorg/not-cached-here", "ratio": 0.3, "calibration": {"dataset": str(texts), **small}}
    hub_texts = {"model": str(llama_dir), "ratio": 0.3, "calibration": {"dataset": "wikitext2", **small}}
    jobs = [service.submit(hub_model), service.submit(hub_texts)]
    for job in jobs:
        assert execute(job, settings) == "FAILED"
        shown = service.show(job)
        for text in [shown["error"], *(line["message"] for line in shown["log"])]:
            assert not CLASS_NAME.search(text) and "\n" not in text, text
        assert "error id" in shown["error"]
        assert CLASS_NAME.search(service.show(job, internal=True)["traceback"])  # the operator's view keeps it
