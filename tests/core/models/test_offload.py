"""Activations kept away from the device (``activations: host``) against the same run keeping them on it.

A CPU has no second memory to spill to, so the tests stand a recording home in for pinned host
memory: it stores each float32 activation as float64 and fetches it back. Any path that used a
stored tensor without fetching it would hand a float64 tensor to a float32 block and fail; any
that fetched what it had not stored would trip the dtype check; and the float32 → float64 → float32
round trip is exact, so the pruned weights must equal the plain run's.
"""

import types
import weakref

import pytest
import torch

import core.pipeline.sequential as sequential
from core import prune
from core.models.adapter import adapter_for
from core.models.loading import load_model
from core.models.offload import Offload, activation_bytes, block_working_bytes, choose_offload
from core.pipeline.runner import BlockRunner
from core.spec.recipe import Recipe
from tests.conftest import recipe_for


class _RecordingHome(Offload):
    """Stores as float64 (a stand-in for another memory), fetches as float32, counts live bytes."""

    def __init__(self, device):
        super().__init__(device)
        self.host = True  # as a spilled run reports itself
        self.stored = self.fetched = 0
        self.live = self.peak = 0

    def store(self, t):
        assert t.dtype == torch.float32, "stored twice, or not an activation of the float32 model"
        out = t.double()
        self.stored += 1
        size = t.numel() * t.element_size()  # the bytes the real home would hold (the model's dtype)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(out, self._freed, size)
        return out

    def _freed(self, size):
        self.live -= size

    def fetch(self, t):
        assert t.dtype == torch.float64, "fetched a tensor that was never stored"
        self.fetched += 1
        return t.float()


def _run_both(monkeypatch, recipe, **kw):
    plain = prune(recipe, **kw)
    homes = []

    def recording(*args, **_):
        homes.append(_RecordingHome(torch.device("cpu")))
        return homes[-1]

    monkeypatch.setattr(sequential, "offload_for", recording)
    spilled = prune(recipe, **kw)
    return plain, spilled, homes[0]


def _assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert torch.equal(sa[name], sb[name]), name


@pytest.mark.parametrize(
    ("family", "kw"),
    [
        ("llama", {}),  # paper-exact LIAR, held-aside error report from the replayed inputs
        ("llama", {"criterion": {"name": "auto"}, "reconstruction": {"method": "ls", "select": "auto"}}),  # default
        ("llama", {"reconstruction": {"method": "ls", "target": "dense"}}),  # error feedback: dense states too
        ("llama", {"head_ratio": "obs", "reconstruction": {"method": "ls", "select": "obs"}}),
        ("qwen2", {"criterion": {"name": "flap"}, "reconstruction": {"method": "bias"}}),
        ("bert", {"reconstruction": {"method": "ls"}}),  # padded batches: token masks
    ],
)
def test_activations_kept_elsewhere_give_the_same_pruned_model(family, kw, model_dirs, corpus, monkeypatch):
    recipe = recipe_for(model_dirs[family], corpus, device="cpu", **kw)
    plain, spilled, home = _run_both(monkeypatch, recipe)
    for a, b in zip(plain.plan.layers, spilled.plan.layers, strict=True):
        assert (a.heads, a.kv_heads, list(map(int, a.neurons))) == (b.heads, b.kv_heads, list(map(int, b.neurons)))
    _assert_same_model(plain.model, spilled.model)
    assert [r.error_after for r in plain.report] == [r.error_after for r in spilled.report]
    assert home.stored > 0 and home.fetched > 0
    assert spilled.metrics["activations"] == "host" and plain.metrics["activations"] == "device"


def test_streamed_run_with_activations_elsewhere_writes_the_same_checkpoint(llama_dir, corpus, tmp_path, monkeypatch):
    recipe = recipe_for(llama_dir, corpus, device="cpu", execution="stream", criterion={"name": "obs"})
    recipe["allocation"] = "global"
    plain = prune(recipe, output_dir=tmp_path / "a")
    homes = []
    monkeypatch.setattr(sequential, "offload_for", lambda *a, **k: homes.append(_RecordingHome("cpu")) or homes[-1])
    spilled = prune(recipe, output_dir=tmp_path / "b")
    a, b = (r.save(tmp_path / f"saved-{n}") for n, r in (("a", plain), ("b", spilled)))
    from safetensors.torch import load_file

    for shard in sorted(a.glob("*.safetensors")):
        ta, tb = load_file(shard), load_file(b / shard.name)
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), shard.name
    assert homes[0].stored > 0


def test_the_estimate_bounds_what_the_run_keeps(llama_dir, corpus, monkeypatch):
    """activation_bytes, which decides auto, is an upper bound of the activations a run really keeps
    at once (measured by the recording home), also with error feedback's dense states."""
    for target in ("pruned", "dense"):
        recipe = recipe_for(llama_dir, corpus, device="cpu", reconstruction={"method": "ls", "target": target})
        _, spilled, home = _run_both(monkeypatch, recipe)
        monkeypatch.undo()
        cal = recipe["calibration"]
        tokens = (cal["num_calibration_samples"] + cal["holdout_samples"]) * cal["max_seq_length"]
        bound = activation_bytes(adapter_for(spilled.model), tokens, 4, dense=target == "dense")
        assert 0 < home.peak <= bound, (home.peak, bound)
        assert home.peak > bound / 4  # a bound, not a guess orders of magnitude off


def test_auto_keeps_activations_on_the_device_while_they_fit():
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    assert not choose_offload("auto", gpu, needed=60, working=30, free=100).host
    assert choose_offload("auto", gpu, needed=80, working=30, free=100).host
    assert choose_offload("host", gpu, needed=1, working=1, free=100).host
    assert not choose_offload("device", gpu, needed=10**12, working=1, free=100).host  # asked for: OOM is theirs
    for choice in ("auto", "host", "device"):  # a CPU computes where it stores
        assert not choose_offload(choice, cpu, needed=10**12, working=1, free=1).host


def test_block_working_bytes_counts_weights_statistics_and_a_batch(llama_dir):
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    layer = adapter.layers(model)[0]
    weights = sum(p.numel() * 4 for p in layer.parameters())
    c = max(adapter.n_neurons, adapter.hidden)
    got = block_working_bytes(layer, adapter, batch_tokens=100, itemsize=4)
    assert got == weights + 3 * c * c * 8 + 100 * 4 * 4 * (adapter.n_neurons + adapter.hidden)


def test_recipe_refuses_an_unknown_activations_place(llama_dir, corpus):
    with pytest.raises(ValueError, match="activations"):
        Recipe.model_validate(recipe_for(llama_dir, corpus, activations="disk"))
    assert Recipe.model_validate(recipe_for(llama_dir, corpus)).activations == "auto"


def test_streamed_perplexity_with_hidden_states_elsewhere(llama_dir, corpus, tmp_path, monkeypatch):
    """Streamed perplexity keeps every window's hidden states between blocks: through the recording
    home they give the same value as kept in place."""
    import core.evaluation.streamed as streamed  # the block-by-block forward chooses the home there
    from core.evaluation.perplexity import perplexity_streamed

    result = prune(recipe_for(llama_dir, corpus, device="cpu"), output_dir=tmp_path / "ckpt")
    checkpoint = result.save(tmp_path / "ckpt")
    text = " ".join(corpus)
    plain = perplexity_streamed(checkpoint, None, [text], seq_len=16, batch_size=3, device="cpu")
    homes = []
    monkeypatch.setattr(streamed, "choose_offload", lambda *a, **k: homes.append(_RecordingHome("cpu")) or homes[-1])
    spilled = perplexity_streamed(checkpoint, None, [text], seq_len=16, batch_size=3, device="cpu")
    assert spilled == plain and plain["windows"] > 3
    assert homes[0].stored == homes[0].fetched > 0  # every window's states stored, each used once


# Two runs of the same arithmetic in float64 are told apart only by rounding: eps64 = 2.2e-16 per
# operation, amplified by the pipeline. The damp-0 least-squares solves of a tiny model on a few
# hundred calibration tokens are ill-conditioned: its float32 runs land up to 2.3e-4 = 2e3·eps32 from
# its float64 runs, so float64 rounding reaches about 2e3·eps64 = 5e-13. The bound allows an
# amplification of 1e6, 500 times that, whatever the CPU's kernels block their sums like, and is
# still eight orders of magnitude below a wrong FFN (a skipped norm, the wrong neurons: 1e-2 and
# more). In float32 the same comparison is rounding against rounding: 1.1e-4 on an AVX2-only CPU,
# 1e-7 with AVX-512, for the same code, which no fixed float32 bound separates from a small bug.
FLOAT64_ROUNDING = 1e6 * torch.finfo(torch.float64).eps


def _assert_same_function(a, b, tol=FLOAT64_ROUNDING):
    """The same shapes, and the same outputs up to rounding: ‖a(x) − b(x)‖ ≤ tol ‖a(x)‖ on random
    tokens. The weights themselves are not compared tightly: a tiny model's later solves can amplify
    a rounding difference in their inputs along directions its calibration data hardly excite."""
    sa, sb = a.state_dict(), b.state_dict()
    assert {k: v.shape for k, v in sa.items()} == {k: v.shape for k, v in sb.items()}
    ids = torch.randint(0, a.config.vocab_size, (3, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ya, yb = a(input_ids=ids)[0], b(input_ids=ids)[0]
    assert (ya - yb).norm() <= tol * ya.norm(), ((ya - yb).norm(), ya.norm())


@pytest.mark.parametrize(
    ("family", "kw"),
    [
        ("llama", {}),  # paper-exact LIAR, held-aside error report
        ("llama", {"criterion": {"name": "auto"}, "reconstruction": {"method": "ls", "select": "auto"}}),  # default
        ("llama", {"reconstruction": {"method": "ls", "target": "dense"}}),  # error feedback
        ("llama", {"head_ratio": "obs", "reconstruction": {"method": "ls", "select": "obs"}}),
        ("llama", {"calibration": {"holdout_samples": 0}}),  # error report on the fit statistics
        ("qwen2", {"criterion": {"name": "flap"}, "reconstruction": {"method": "bias"}}),
        ("gemma2", {"reconstruction": {"method": "ls"}}),  # sandwich norms around the FFN
        ("phi3", {}),  # gate and up fused in one projection
        ("opt", {}),  # the FFN inline in the block, its activation a module of its own
        ("bert", {"reconstruction": {"method": "ls"}}),  # padded batches, post-norm
    ],
)
def test_a_recomputed_ffn_gives_the_replayed_model(family, kw, request, corpus):
    """activations: recompute runs the pruned FFN in each block's output pass instead of replaying its
    kept inputs: the same units are kept and the pruned models agree to rounding (the kept rows of
    gate / up multiply the same inputs as the dense ones did). Both run in float64."""
    model_dir = request.getfixturevalue(f"{family}_dir")

    def run(**extra):  # in float64: the two paths' difference is then far below a logic error's
        model, tokenizer, _ = load_model(str(model_dir), "float32", "cpu")
        recipe = recipe_for(model_dir, corpus, device="cpu", **extra, **kw)
        return prune(recipe, model=model.double(), tokenizer=tokenizer)

    replayed, recomputed = run(), run(activations="recompute")
    for a, b in zip(replayed.plan.layers, recomputed.plan.layers, strict=True):
        assert (a.heads, a.kv_heads, list(map(int, a.neurons))) == (b.heads, b.kv_heads, list(map(int, b.neurons)))
    _assert_same_function(replayed.model, recomputed.model)
    for a, b in zip(replayed.report, recomputed.report, strict=True):
        assert a.error_after == pytest.approx(b.error_after, rel=FLOAT64_ROUNDING, abs=1e-12)
    assert recomputed.metrics["activations"] == "recompute" and replayed.metrics["activations"] == "device"


class _RecomputingHome(_RecordingHome):
    def __init__(self, device):
        super().__init__(device)
        self.recompute = True


@pytest.mark.parametrize("holdout", [4, 0])
def test_a_recomputed_ffn_keeps_none_of_its_fit_inputs(llama_dir, corpus, monkeypatch, holdout):
    """Through the recording home: the run that recomputes the FFN stores less by at least the fit
    batches' kept FFN inputs, stays under the estimate that decides auto's recompute tier, and writes
    the same model (the spilled and in-place recomputing runs agree exactly)."""
    recipe = recipe_for(llama_dir, corpus, device="cpu", calibration={"holdout_samples": holdout})
    homes = {}
    results = {}
    for name, home in (("replay", _RecordingHome), ("recompute", _RecomputingHome)):
        record = lambda *a, home=home, name=name, **k: homes.setdefault(name, home("cpu"))  # noqa: E731
        monkeypatch.setattr(sequential, "offload_for", record)
        results[name] = prune(recipe)
    monkeypatch.undo()
    in_place = prune({**recipe, "activations": "recompute"})
    _assert_same_model(results["recompute"].model, in_place.model)

    cal = recipe["calibration"]
    fit_tokens, held_tokens = cal["num_calibration_samples"] * cal["max_seq_length"], holdout * cal["max_seq_length"]
    kept_neurons = min(len(lp.neurons) for lp in results["replay"].plan.layers)
    ffn_inputs = fit_tokens * kept_neurons * 4
    saved = homes["replay"].peak - homes["recompute"].peak
    assert saved >= ffn_inputs * 0.9, (saved, ffn_inputs)
    adapter = adapter_for(in_place.model)
    lean = activation_bytes(adapter, fit_tokens + held_tokens, 4, ffn_tokens=held_tokens)
    assert 0 < homes["recompute"].peak <= lean < activation_bytes(adapter, fit_tokens + held_tokens, 4)


def test_auto_recomputes_the_ffn_before_it_spills_to_the_host():
    gpu, cpu = torch.device("cuda"), torch.device("cpu")
    pick = lambda free, **kw: choose_offload("auto", gpu, needed=80, working=30, free=free, lean=50, **kw).name  # noqa: E731
    assert [pick(110), pick(100), pick(79)] == ["device", "recompute", "host"]
    assert choose_offload("host", gpu, needed=1, working=1, free=100, lean=1).recompute  # copies cost more
    assert choose_offload("recompute", gpu, needed=1, working=1, free=100, lean=1).name == "recompute"
    # an evaluation has no FFN to recompute (no lean size): device or host only
    assert choose_offload("auto", gpu, needed=80, working=30, free=100).name == "host"
    assert not choose_offload("recompute", gpu, needed=1, working=1, free=100).recompute
    # a CPU keeps everything in place unless asked to recompute (host: the least memory there too)
    assert choose_offload("auto", cpu, needed=10**12, working=1, free=1, lean=1).name == "device"
    on_cpu = [choose_offload(c, cpu, needed=1, working=1, lean=1).name for c in ("recompute", "host")]
    assert on_cpu == ["recompute", "recompute"]


def test_a_replay_gathers_kept_channels_on_the_device_its_inputs_are_fetched_to(monkeypatch):
    """Inputs kept in host memory are fetched to the device before the kept channels are gathered:
    the gather's index must be on that device too (a CUDA kernel refuses a host index; the CPU and
    meta kernels do not check, so the check is made here). "meta" stands in for the device."""
    import core.pipeline.runner as runner_module

    class _MetaHome(Offload):
        def fetch(self, t):
            return t.to("meta")

    real = runner_module.select_channels

    def checked(x, index):
        assert index.device == x.device, f"index on {index.device}, inputs on {x.device}"
        return real(x, index)

    monkeypatch.setattr(runner_module, "select_channels", checked)
    keep = torch.tensor([True, False, True, True, False, True])
    held_aside = torch.randn(2, 3, 6)  # stored whole: the replay selects the kept channels itself
    runner = types.SimpleNamespace(batch=0, offload=_MetaHome("meta"))
    replay = runner_module._Replay([held_aside], keep, None, False, runner)
    out = replay()
    assert out.device.type == "meta" and out.shape == (2, 3, 4)


class _NoHandle:
    def remove(self):
        pass


@pytest.mark.parametrize(
    ("family", "kw"),
    [
        ("llama", {}),  # paper-exact LIAR, held-aside report
        ("llama", {"calibration": {"holdout_samples": 0}}),  # report on the fit statistics
        ("llama", {"criterion": {"name": "auto"}, "reconstruction": {"method": "ls", "select": "auto"}}),  # default
        ("llama", {"reconstruction": {"method": "ls", "target": "dense"}}),  # error feedback
        ("llama", {"activations": "recompute"}),  # the output pass runs the pruned FFN on the folded input
        ("gemma3", {"reconstruction": {"method": "ls"}}),  # sandwich norms: the attention's output is normed
        ("phi3", {}),  # fused projections
        ("opt", {}),  # no FFN input norm: nothing is folded
    ],
)
def test_folding_the_attention_output_into_the_block_input_changes_nothing(family, kw, request, corpus, monkeypatch):
    """The FFN pass stores the residual stream entering the FFN in place of the block input and the
    attention's replayed output: the pruned model is the one the two kept side by side give, bit for
    bit, and the run keeps one hidden-size activation per token less at its peak (recording home)."""
    recipe = recipe_for(request.getfixturevalue(f"{family}_dir"), corpus, device="cpu", **kw)
    folded, folded_home = _run_both(monkeypatch, recipe)[1:]
    monkeypatch.undo()
    monkeypatch.setattr(BlockRunner, "absorb", lambda *a, **k: _NoHandle())
    apart, apart_home = _run_both(monkeypatch, recipe)[1:]
    for a, b in zip(folded.plan.layers, apart.plan.layers, strict=True):
        assert (a.heads, a.kv_heads, list(map(int, a.neurons))) == (b.heads, b.kv_heads, list(map(int, b.neurons)))
    _assert_same_model(folded.model, apart.model)
    assert [r.error_after for r in folded.report] == [r.error_after for r in apart.report]
    if family == "opt":
        assert folded_home.peak == apart_home.peak
        return
    assert folded_home.peak <= apart_home.peak
    if kw.get("reconstruction", {}).get("target") == "dense":
        return  # the dense model's states and inputs peak elsewhere in the block
    cal = recipe["calibration"]
    tokens = (cal["num_calibration_samples"] + cal.get("holdout_samples", 4)) * cal["max_seq_length"]
    hidden = adapter_for(folded.model).hidden
    assert apart_home.peak - folded_home.peak >= tokens * hidden * 4 // 2, (apart_home.peak, folded_home.peak)


def test_auto_sets_aside_less_for_a_refit_than_for_the_obs_selection(llama_dir, corpus, monkeypatch):
    """What a block's solves hold (in C × C matrices), which auto weighs against the free memory:
    a refit's bound for liar / ls with the criterion's units, three with the OBS selection or with
    error feedback's paired statistics."""
    from core.models.offload import OBS_MATRICES, REFIT_MATRICES

    seen = []

    def recording(*args, **kwargs):
        seen.append((args[-1] if args else kwargs["work"]).matrices)
        return Offload("cpu")

    monkeypatch.setattr(sequential, "offload_for", recording)
    for kw in (
        {},
        {"reconstruction": {"method": "ls", "select": "obs"}},
        {"reconstruction": {"method": "ls", "target": "dense"}},
    ):
        prune(recipe_for(llama_dir, corpus, device="cpu", **kw))
    assert seen == [REFIT_MATRICES, OBS_MATRICES, OBS_MATRICES]
