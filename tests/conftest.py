"""Shared fixtures: tiny random models written to a session temp dir (no downloads); the markers'
rules; where the browser tests' screenshots go."""

import os
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("GRADIO_ANALYTICS_ENABLED", "False")
# the app servers offer the tiny random model only: no test pays for preparing SmolLM2 (app/cli/firstrun.py)
os.environ.setdefault("LIAR_BUNDLED", "tiny")
# Some virtual machines advertise AMX but do not enable it for processes: oneDNN's AMX bfloat16
# kernels then die with SIGILL. Capping the ISA keeps the bfloat16 tests on AVX-512 kernels.
os.environ.setdefault("ONEDNN_MAX_CPU_ISA", "AVX512_CORE_BF16")
# Test processes side by side (`make test`: pytest-xdist) share the cores: each takes its share of
# threads, and so do the workers and servers its tests start (they inherit OMP_NUM_THREADS). With two
# threads in each of 3 processes on 2 cores, OpenMP's spinning threads made the engine's tests 2.8×
# slower (152 s against 55 s, tests/core's fast tier). One process alone keeps two threads.
_PROCESSES = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
THREADS = max(1, min(2, (os.cpu_count() or 2) // _PROCESSES))
os.environ.setdefault("OMP_NUM_THREADS", str(THREADS))

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers.utils import logging as hf_logging  # noqa: E402

from core.models.tiny import tiny_bert, tiny_corpus, tiny_decoder  # noqa: E402
from tests.timing import TestTimes  # noqa: E402

hf_logging.disable_progress_bar()
hf_logging.set_verbosity_error()
torch.set_num_threads(THREADS)

# Fixtures that start servers or worker processes: a test using one is an integration test (marked
# explicitly in its module; the rule below keeps a new test out of `make test-fast` if it is not).
INTEGRATION_FIXTURES = {"stack", "faults", "app_servers", "app_server", "login_server", "team", "broker_down"}


def pytest_addoption(parser):
    parser.addoption(
        "--screenshots",
        metavar="DIR",
        help="write the browser tests' screenshots to DIR (`make screenshots`: docs/screenshots); "
        "default: a temporary folder",
    )
    parser.addoption("--test-time", metavar="PATH", help="write each marker's test time as JSON (tests/timing.py)")


def pytest_configure(config):
    config.pluginmanager.register(TestTimes(config), "test-times")


def pytest_collection_modifyitems(config, items):
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def fast_first(n: int, cases) -> list:
    """A parametrize list whose first ``n`` cases run in `make test-fast` and the rest are marked slow
    (`make test` runs them all); a tuple case is a test's several arguments. Marked on one axis of
    stacked parametrizes, it keeps that axis's first values fast for every value of the others."""
    return [
        case if i < n else pytest.param(*(case if isinstance(case, tuple) else (case,)), marks=pytest.mark.slow)
        for i, case in enumerate(cases)
    ]


@pytest.fixture(scope="session")
def screenshots_dir(request, tmp_path_factory) -> Path:
    """The folder the browser tests write their screenshots to: pytest's temporary folder, so that a
    test run leaves the tracked docs/screenshots/ alone, unless ``--screenshots DIR`` names one."""
    chosen = request.config.getoption("--screenshots")
    path = Path(chosen) if chosen else tmp_path_factory.mktemp("screenshots")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="session")
def corpus():
    return tiny_corpus(40)


@pytest.fixture(scope="session")
def llama_dir(tmp_path_factory):
    return tiny_decoder(tmp_path_factory.mktemp("models") / "llama", "llama")


@pytest.fixture(scope="session")
def llama_mha_dir(tmp_path_factory):
    """Multi-head attention (as LLaMA-7B): 8 query and 8 key/value heads of 8 channels, hidden size 64."""
    return tiny_decoder(tmp_path_factory.mktemp("models") / "llama-mha", "llama", num_key_value_heads=8)


@pytest.fixture(scope="session")
def qwen2_dir(tmp_path_factory):
    return tiny_decoder(tmp_path_factory.mktemp("models") / "qwen2", "qwen2")


@pytest.fixture(scope="session")
def mistral_dir(tmp_path_factory):
    return tiny_decoder(tmp_path_factory.mktemp("models") / "mistral", "mistral")


# the families added after the first three, which every family-template test also runs on
NEW_FAMILIES = ["qwen3", "gemma2", "gemma3", "phi3", "opt"]
DECODER_FAMILIES = ["llama", "mistral", "qwen2", *NEW_FAMILIES]


def _decoder_dir_fixture(family: str):
    @pytest.fixture(scope="session", name=f"{family}_dir")
    def fixture(tmp_path_factory):
        return tiny_decoder(tmp_path_factory.mktemp("models") / family, family)

    return fixture


for _family in NEW_FAMILIES:  # qwen3_dir, gemma2_dir, ...: one tiny random model per new family
    globals()[f"{_family}_dir"] = _decoder_dir_fixture(_family)


@pytest.fixture(scope="session")
def bert_dir(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("models") / "bert", "classification")


@pytest.fixture(scope="session")
def bert_qa_dir(tmp_path_factory):
    return tiny_bert(tmp_path_factory.mktemp("models") / "bert_qa", "qa")


@pytest.fixture(scope="session")
def model_dirs(llama_dir, qwen2_dir, bert_dir):
    return {"llama": llama_dir, "qwen2": qwen2_dir, "bert": bert_dir}


def recipe_for(model_dir, corpus, **kw):
    """A small recipe dict for the tiny models; keyword arguments override top-level fields."""
    cal = {"texts": corpus, "num_calibration_samples": 12, "max_seq_length": 24, "holdout_samples": 4, "batch_size": 5}
    cal.update(kw.pop("calibration", {}))
    recipe = {
        "model": str(model_dir),
        "ratio": 0.3,
        "calibration": cal,
        "reconstruction": {"method": "liar", "damp": 0.0},
        # the references are written for a named criterion (the default, auto, resolves per model and
        # ratio: tests/core/spec/test_recipe.py)
        "criterion": {"name": "magnitude"},
    }
    recipe.update(kw)
    # the paper's selection (the criterion's units), which the references compare with, unless asked
    recipe["reconstruction"] = {"select": "criterion", **recipe["reconstruction"]}
    return recipe
