"""A library caller's ``core.prune`` leaves the process as it found it: torch's ``nn.Linear.forward``
throughout, no forward left on any module instance, glibc's malloc untouched — unless an application
configured the engine (``core/kernels/cpu_matmul.py``, ``core/models/host_memory.py``); then the
route is on for the run only, and removed when the run returns or raises."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import core
from core.kernels import cpu_matmul
from core.models import host_memory
from core.models.loading import load_model
from tests.conftest import recipe_for


@pytest.fixture(autouse=True)
def unconfigured():
    """As a library user's process: no application configured anything."""
    cpu_matmul.reset()
    host_memory.configure(False)
    yield
    cpu_matmul.reset()
    host_memory.configure(False)


class _FakeLibc:
    """glibc's malloc tuning calls, recorded instead of made."""

    def __init__(self):
        self.calls: list[tuple] = []

    def mallopt(self, *args):
        self.calls.append(("mallopt", *args))
        return 1

    def malloc_trim(self, *args):
        self.calls.append(("malloc_trim", *args))
        return 1


def _leftovers(model: nn.Module) -> list[str]:
    return [n for n, m in model.named_modules() if "forward" in m.__dict__ or m._forward_pre_hooks]


def test_a_library_prune_keeps_torch_s_forward_and_the_allocator_as_they_were(llama_dir, corpus, tmp_path, monkeypatch):
    stock = nn.Linear.forward
    libc = _FakeLibc()
    monkeypatch.setattr(host_memory, "_libc", lambda: libc)
    seen: list[bool] = []

    def progress(stage, done, total):
        seen.append(nn.Linear.forward is stock)

    model, tokenizer, _ = load_model(str(llama_dir), "float32", "cpu")
    hooked = model.model.layers[0].mlp.down_proj
    hooked.register_forward_hook(lambda m, args, out: seen.append("forward" not in m.__dict__))
    recipe = recipe_for(llama_dir, corpus, device="cpu")
    result = core.prune(recipe, model=model, tokenizer=tokenizer, progress=progress)
    streamed = core.prune(recipe, progress=progress, output_dir=tmp_path / "out")  # blocks read one at a time
    assert streamed.metrics["execution"] == "stream"
    assert len(seen) > 20 and all(seen), "torch's own forward at every stage and in every call of the hooked Linear"
    assert nn.Linear.forward is stock
    assert _leftovers(result.model) == []
    assert libc.calls == [], "a library call leaves glibc's malloc settings alone"
    host_memory.configure(True)  # an application opted in: the same run tunes the allocator
    core.prune(recipe, output_dir=tmp_path / "tuned").discard()
    assert any(c[0] == "mallopt" for c in libc.calls)


@pytest.fixture
def onednn(monkeypatch):
    """The route on, as the CLI configures it; counts the engine's routed ``linear`` calls."""
    monkeypatch.setattr(cpu_matmul, "MIN_MACS", 0)  # the tiny model's products are small
    cpu_matmul.configure("onednn")
    assert cpu_matmul.backend() == "onednn"
    count = {"linear": 0}
    real = cpu_matmul.linear

    def spy(*args):
        count["linear"] += 1
        return real(*args)

    monkeypatch.setattr(cpu_matmul, "linear", spy)
    routes: list[cpu_matmul._Route] = []
    install = cpu_matmul._Route.install

    def recorded(self, m):
        routes.append((self, m))  # strong references: the modules can be checked after the run
        return install(self, m)

    monkeypatch.setattr(cpu_matmul._Route, "install", recorded)
    return count, routes


def _logits(model):
    ids = torch.randint(0, 60, (3, 20), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        return model(input_ids=ids).logits


@pytest.mark.parametrize("where", ["memory", "stream"])
def test_a_configured_route_covers_the_run_and_is_removed_after_it(onednn, llama_dir, corpus, tmp_path, where):
    count, routes = onednn
    recipe = recipe_for(
        llama_dir, corpus, dtype="float32", device="cpu", reconstruction={"method": "liar", "damp": 1e-3}
    )
    out = {"output_dir": tmp_path / "out"} if where == "stream" else {}
    result = core.prune(recipe, **out)
    assert result.metrics["execution"] == where
    assert count["linear"] > 20, "the model's projections (and a pruned block's new ones) through the route"
    assert {id(m) for _, m in routes} and all("forward" not in m.__dict__ for _, m in routes)
    assert all(not m._forward_pre_hooks for _, m in routes)
    if where == "memory":
        assert _leftovers(result.model) == []
        routed = _logits(result.model)  # outside the run: torch's products
        cpu_matmul.configure("blas")
        blas = core.prune(recipe)
        torch.testing.assert_close(routed, _logits(blas.model), rtol=1e-4, atol=1e-4)
    else:
        result.discard()


def test_a_route_is_removed_when_the_run_raises(onednn, llama_dir, corpus):
    _, routes = onednn
    model, tokenizer, _ = load_model(str(llama_dir), "float32", "cpu")

    def stop(stage, done, total):
        if stage == "reconstruct" and done == 1:
            raise RuntimeError("cancelled")

    recipe = recipe_for(llama_dir, corpus, dtype="float32", device="cpu")
    with pytest.raises(RuntimeError, match="cancelled"):
        core.prune(recipe, model=model, tokenizer=tokenizer, progress=stop)
    assert routes and _leftovers(model) == []
    assert all("forward" not in m.__dict__ for _, m in routes)
