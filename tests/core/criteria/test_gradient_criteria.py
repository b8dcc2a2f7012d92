"""SNIP, Kwon, Taylor and KCM against slow references; allocation with layer ranges, Kwon's search
and rearrangement, rounding of kept widths; every criterion end to end; bad options."""

import json

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from core import prune
from core.allocation.plan import Budget, _kwon_search, allocate, greedy_rearrange
from core.criteria import LayerInputs, Scores, score_layer
from core.criteria.gradients import _per_sample_loss, mask_gradients, weight_gradients
from core.criteria.kcm import kcm_r2
from core.data.calibration import decoder_windows, encoder_samples, load_labels, load_texts
from core.models.adapter import unit_costs
from core.models.loading import load_model
from core.pipeline.scoring import split_batches
from core.spec.recipe import Recipe
from core.stats.accumulate import ChannelStats
from core.stats.reconstruct import METHODS
from tests.conftest import fast_first, recipe_for


@pytest.fixture(scope="module")
def labelled(tmp_path_factory, corpus):
    """A .jsonl calibration file with a binary label per record (for encoder task losses)."""
    path = tmp_path_factory.mktemp("data") / "labelled.jsonl"
    path.write_text("\n".join(json.dumps({"text": t, "label": i % 2}) for i, t in enumerate(corpus)))
    return path


def _setup(model_dir, corpus, labelled=None, n=6):
    cal = {"num_calibration_samples": n, "max_seq_length": 16, "holdout_samples": 0, "batch_size": 4}
    if labelled is not None:
        cal.update(dataset=str(labelled), label_field="label")
        recipe = Recipe.model_validate(recipe_for(model_dir, corpus, calibration={**cal, "texts": None}))
    else:
        recipe = Recipe.model_validate(recipe_for(model_dir, corpus, calibration=cal))
    model, tok, adapter = load_model(recipe.model, "float32", "cpu")
    model = model.double()
    c = recipe.calibration
    if adapter.kind == "decoder":
        fit, _ = decoder_windows(load_texts(c), tok, c)
    else:
        fit, _ = encoder_samples(load_texts(c), tok, c, load_labels(c))
    return model, adapter, fit


def _reference_mask_grads(model, adapter, fit):
    """Per-sample ∂L_i/∂m from x·∂L_i/∂x at the o_proj / down_proj inputs, one sample at a time."""
    fam, d = adapter.family, adapter.head_dim
    out = {}
    for i in range(len(fit)):
        store = {}
        hooks = []
        for li, layer in enumerate(adapter.layers(model)):
            for kind, path in ((0, fam.o), (1, fam.ffn_out)):

                def pre(_m, a, key=(li, kind), store=store):
                    store[key] = a[0]  # part of the graph (the weights require grad): ∂L/∂x is total

                hooks.append(layer.get_submodule(path).register_forward_pre_hook(pre))
        with torch.enable_grad():
            loss = _per_sample_loss(model, adapter, fit.slice(i, i + 1), "cpu").sum()
            xs = list(store.values())
            grads = torch.autograd.grad(loss, xs)
        for h in hooks:
            h.remove()
        for (key, x), g in zip(store.items(), grads):
            per_channel = (x * g).sum(dim=tuple(range(x.dim() - 1)))  # Σ over tokens
            if key[1] == 0:
                per_channel = per_channel.reshape(adapter.n_heads, d).sum(1)
            out.setdefault(key, []).append(per_channel)
    return {k: torch.stack(v) for k, v in out.items()}


@pytest.mark.parametrize("name", ["llama", "bert", "opt", "gemma2", "phi3"])
def test_mask_gradients_match_input_gradient_reference(name, request, corpus, labelled):
    """OPT's FFN sees its tokens flattened into rows; the masks follow them."""
    model_dir = request.getfixturevalue(f"{name}_dir")
    model, adapter, fit = _setup(model_dir, corpus, labelled if name == "bert" else None)
    got = mask_gradients(model, adapter, split_batches(fit, 4), keep_samples=True)
    ref = _reference_mask_grads(model, adapter, fit)
    for li, g in enumerate(got):
        torch.testing.assert_close(g.heads_samples.double(), ref[(li, 0)], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g.neurons_samples.double(), ref[(li, 1)], rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g.heads_sum.double(), ref[(li, 0)].sum(0), rtol=1e-4, atol=1e-6)
        torch.testing.assert_close(g.neurons_sq.double(), ref[(li, 1)].pow(2).sum(0), rtol=1e-4, atol=1e-8)
    # checkpointing recomputes blocks but must not change a single gradient
    again = mask_gradients(model, adapter, split_batches(fit, 4), keep_samples=False, checkpointing=True)
    torch.testing.assert_close(again[0].heads_sum, got[0].heads_sum)
    assert again[0].heads_samples is None


def test_mask_gradient_equals_finite_difference(llama_dir, corpus):
    """∂L/∂m_h by central differences: scaling a head's o_proj columns is masking its output.
    (eps 1e-3: the rotary tables are float32 even in a float64 model, so smaller steps are noise.)"""
    model, adapter, fit = _setup(llama_dir, corpus)
    g = mask_gradients(model, adapter, [fit], keep_samples=False)
    layer, h, d, eps = adapter.layers(model)[1], 3, adapter.head_dim, 1e-3
    w = layer.self_attn.o_proj.weight

    def loss_at(scale):
        saved = w.data.clone()
        w.data[:, h * d : (h + 1) * d] *= scale
        with torch.no_grad():
            value = float(_per_sample_loss(model, adapter, fit, "cpu").sum())
        w.data.copy_(saved)
        return value

    fd = (loss_at(1 + eps) - loss_at(1 - eps)) / (2 * eps)
    assert float(g[1].heads_sum[h]) == pytest.approx(fd, rel=1e-3)


def test_snip_scores_are_normalised_sensitivities(llama_dir, corpus):
    model, adapter, fit = _setup(llama_dir, corpus)
    ref = _reference_mask_grads(model, adapter, fit)
    from core import criteria

    grads = mask_gradients(model, adapter, split_batches(fit, 4), keep_samples=False)
    scores = criteria.get("snip").finalize(
        [score_layer("snip", layer, adapter, i, {}, grads[i]) for i, layer in enumerate(adapter.layers(model))], {}
    )
    total_h = sum(ref[(li, 0)].sum(0).abs().sum() for li in range(adapter.n_layers))
    total_n = sum(ref[(li, 1)].sum(0).abs().sum() for li in range(adapter.n_layers))
    for li, s in enumerate(scores):  # s_k = |g_k| / Σ_j |g_j| over the network, per unit kind
        torch.testing.assert_close(s.heads.double(), ref[(li, 0)].sum(0).abs() / total_h, rtol=1e-4, atol=1e-7)
        torch.testing.assert_close(s.neurons.double(), ref[(li, 1)].sum(0).abs() / total_n, rtol=1e-4, atol=1e-7)
    assert sum(float(s.heads.sum()) for s in scores) == pytest.approx(1.0)


def _reference_weight_grads(model, adapter, fit, second_order):
    """Plain full-model backward in float64: mean loss gradient, and mean per-sample squared gradient."""
    for p in model.parameters():
        p.grad = None
    with torch.enable_grad():
        _per_sample_loss(model, adapter, fit, "cpu").mean().backward()
    grad = {n: p.grad.clone() for n, p in model.named_parameters()}
    sq = {n: torch.zeros_like(p) for n, p in model.named_parameters()}
    if second_order:
        for i in range(len(fit)):
            for p in model.parameters():
                p.grad = None
            with torch.enable_grad():
                _per_sample_loss(model, adapter, fit.slice(i, i + 1), "cpu").sum().backward()
            for n, p in model.named_parameters():
                sq[n] += p.grad**2 / len(fit)
    for p in model.parameters():
        p.grad = None
    return grad, sq


@pytest.mark.parametrize("mode", fast_first(2, ["param_first", "param_second", "param_mix", "vectorize"]))
@pytest.mark.parametrize("aggregation", fast_first(1, ["sum", "max"]))
def test_taylor_scores_match_loop_reference(mode, aggregation, llama_dir, corpus):
    model, adapter, fit = _setup(llama_dir, corpus)
    second = mode in ("param_second", "param_mix")
    grads = weight_gradients(model, adapter, split_batches(fit, 4), second_order=second)
    ref_g, ref_sq = _reference_weight_grads(model, adapter, fit, second)
    li, d, n_rep = 1, adapter.head_dim, adapter.n_rep
    prefix = f"model.layers.{li}."
    layer = adapter.layers(model)[li]
    got = score_layer("taylor", layer, adapter, li, {"taylor": mode, "aggregation": aggregation}, grads[li])

    def sal(name):
        w, g, h = (
            layer.get_submodule(name).weight.detach(),
            ref_g[prefix + name + ".weight"],
            ref_sq[prefix + name + ".weight"],
        )
        return {
            "param_first": w * g,
            "vectorize": w * g,
            "param_second": w * h * w,
            "param_mix": w * g - 0.5 * w * h * w,
        }[mode]

    def imp(vec):  # one channel's weights
        return float(vec.sum().abs()) if mode == "vectorize" else float(vec.abs().sum())

    q, k, v, o = (sal(f"self_attn.{p}_proj") for p in "qkvo")
    for h in range(adapter.n_heads):
        per_channel = []
        for r in range(d):
            kv = (h // n_rep) * d + r
            parts = [imp(q[h * d + r]), imp(k[kv]) / n_rep, imp(v[kv]) / n_rep, imp(o[:, h * d + r])]
            per_channel.append(sum(parts) if aggregation == "sum" else max(parts))
        assert float(got.heads[h]) == pytest.approx(sum(per_channel), rel=1e-4)
    gate, up, down = sal("mlp.gate_proj"), sal("mlp.up_proj"), sal("mlp.down_proj")
    for j in range(0, adapter.n_neurons, 7):
        parts = [imp(gate[j]), imp(up[j]), imp(down[:, j])]
        want = sum(parts) if aggregation == "sum" else max(parts)
        assert float(got.neurons[j]) == pytest.approx(want, rel=1e-4)


def test_weight_gradients_leave_no_gradients_behind(llama_dir, corpus):
    model, adapter, fit = _setup(llama_dir, corpus)
    flags = {n: p.requires_grad for n, p in model.named_parameters()}
    weight_gradients(model, adapter, [fit], checkpointing=True)
    assert all(p.grad is None for p in model.parameters())
    assert {n: p.requires_grad for n, p in model.named_parameters()} == flags


def _numpy_r2(x, sigma, alpha):
    d2 = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    k = np.exp(-d2 / sigma**2)
    n = len(x)
    c = np.full((n, n), 1.0 / n)
    while True:
        new = c * np.sqrt(k / (k @ c))
        diff = abs((new - c).sum()) / np.abs(c).sum()
        c = new
        if diff < alpha:
            return np.diag(c)


def test_kcm_matches_numpy_reference(llama_dir):
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    layer = adapter.layers(model)[0]
    w = layer.mlp.down_proj.weight.detach().double()
    x = w.T.numpy() * 4  # spread the points so the kernel is far from all-ones
    np.testing.assert_allclose(kcm_r2(torch.from_numpy(x), 1.0, 0.01).numpy(), _numpy_r2(x, 1.0, 0.01), rtol=1e-10)
    # D2 from streamed activation means, z-scored; combined as R2 × D2
    gen = torch.Generator().manual_seed(0)
    acts = torch.randn(3, 10, adapter.n_neurons, generator=gen) + torch.linspace(-1, 1, adapter.n_neurons)
    stats = ChannelStats(adapter.n_neurons)
    stats.add_batch(acts)
    got = score_layer("kcm", layer, adapter, 0, {}, LayerInputs(ChannelStats(adapter.hidden), stats))
    mean = acts.reshape(-1, adapter.n_neurons).double().mean(0).numpy()
    z = (mean - mean.mean()) / mean.std(ddof=1)
    r2 = _numpy_r2(w.T.numpy(), 1.0, 0.01)
    np.testing.assert_allclose(got.neurons.numpy(), r2 * z, rtol=1e-4, atol=1e-7)
    assert not got.prunable_heads


def test_greedy_rearrangement_finds_cancelling_units():
    # units 0 and 1 have large gradients that cancel; unit 2 is small: pruning {0, 1} costs nothing
    grads = torch.tensor([[5.0, -5.0, 1.0], [3.0, -3.0, 1.0]])
    keep = torch.tensor([True, False, False])  # diagonal (Fisher) ranking keeps a large unit
    new = greedy_rearrange(keep, grads)
    assert new.tolist() == [False, False, True]


def test_greedy_rearrangement_never_worsens_the_block_objective():
    gen = torch.Generator().manual_seed(0)
    for _ in range(20):
        grads = torch.randn(8, 12, generator=gen) @ torch.randn(12, 12, generator=gen)
        diag = grads.pow(2).sum(0)
        keep = torch.zeros(12, dtype=torch.bool)
        keep[torch.argsort(diag, descending=True)[:5]] = True
        new = greedy_rearrange(keep, grads)
        obj = lambda m, g=grads: float(g[:, ~m].sum(1).pow(2).sum())  # noqa: E731
        assert int(new.sum()) == 5 and obj(new) <= obj(keep) + 1e-9


def _plain_rearrangement(keep: torch.Tensor, grads: torch.Tensor) -> torch.Tensor:
    """Kwon et al.'s greedy rearrangement as written: every offer sums the candidate set's gradients
    without each member and keeps the set whose sum has the smallest norm."""
    n_pruned = int((~keep).sum())
    g = grads.T.double()
    order = torch.argsort(g.pow(2).sum(1), stable=True).tolist()
    pruned = order[:n_pruned]
    for unit in order[n_pruned:]:
        pruned.append(unit)
        vecs = g[pruned]
        pruned.pop(int((vecs.sum(0)[None, :] - vecs).pow(2).sum(1).argmin()))
    out = torch.ones_like(keep)
    out[pruned] = False
    return out


def test_greedy_rearrangement_equals_the_plain_algorithm():
    """The running dot products give the same pruned sets as recomputing every candidate's sum, on
    gradients with structure (correlated units) and with dead units (all-zero gradients: exact ties,
    broken the same way)."""
    gen = torch.Generator().manual_seed(1)
    for trial in range(12):
        n, samples = (12, 8) if trial % 2 else (200, 64)
        grads = torch.randn(samples, n, generator=gen) @ torch.randn(n, n, generator=gen)
        grads[:, torch.randperm(n, generator=gen)[: n // 6]] = 0.0
        keep = torch.zeros(n, dtype=torch.bool)
        keep[torch.randperm(n, generator=gen)[: n // 2 + trial]] = True
        assert torch.equal(greedy_rearrange(keep, grads), _plain_rearrangement(keep, grads))


def test_kwon_search_maximises_kept_importance_against_brute_force(llama_dir):
    """On a tiny problem (2 layers, 8 heads in 4 GQA groups, 48 neurons) the search equals a slow
    re-implementation: for each number of heads, fill the rest of the budget neuron by neuron."""
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    layers = adapter.layers(model)
    costs = [unit_costs(layer, adapter) for layer in layers]
    gen = torch.Generator().manual_seed(3)
    scores = [Scores(heads=torch.rand(8, generator=gen), neurons=torch.rand(48, generator=gen) * 0.3) for _ in layers]
    full = sum(8 * c["head"] + 4 * c["kv"] + 48 * c["neuron"] for c in costs)
    target = round(0.4 * full)
    plans = _kwon_search(scores, adapter, costs, target, "both")
    got = sum(
        float(scores[li].heads[lp.heads].sum() + scores[li].neurons[lp.neurons].sum()) for li, lp in enumerate(plans)
    )

    forced = [(int(s.heads.argmax()), int(s.neurons.argmax())) for s in scores]
    heads = sorted(
        [(float(s.heads[h]), li, h) for li, s in enumerate(scores) for h in range(8) if h != forced[li][0]],
        reverse=True,
    )
    neurons = sorted(
        [(float(s.neurons[k]), li, k) for li, s in enumerate(scores) for k in range(48) if k != forced[li][1]],
        reverse=True,
    )
    best = -1.0
    for n_h in range(len(heads) + 1):
        kept = [{forced[li][0]} for li in range(2)]
        for _, li, h in heads[:n_h]:
            kept[li].add(h)
        cost = sum(
            len(kept[li]) * costs[li]["head"] + len({h // 2 for h in kept[li]}) * costs[li]["kv"] for li in range(2)
        )
        cost += sum(costs[li]["neuron"] for li in range(2))
        if cost > full - target:
            break
        total = sum(
            float(scores[li].heads[list(kept[li])].sum() + scores[li].neurons[forced[li][1]]) for li in range(2)
        )
        for value, li, _ in neurons:
            if cost + costs[li]["neuron"] > full - target:
                break
            cost += costs[li]["neuron"]
            total += value
        best = max(best, total)
    assert got == pytest.approx(best, rel=1e-6)
    assert sum(lp.removed for lp in plans) >= target  # the search keeps within the budget


def test_layer_ranges_and_rounding_in_allocation(llama_dir):
    model, _, adapter = load_model(str(llama_dir), "float32", "cpu")
    layers = adapter.layers(model)
    costs = [unit_costs(layer, adapter) for layer in layers]
    params = [sum(p.numel() for p in layer.parameters()) for layer in layers]
    gen = torch.Generator().manual_seed(0)
    scores = [Scores(torch.rand(8, generator=gen), torch.rand(48, generator=gen)) for _ in layers]
    scores[0].prunable_heads = scores[0].prunable_neurons = False
    for allocation in ("uniform", "global"):
        plan = allocate(scores, adapter, costs, params, Budget(ratio=0.2, allocation=allocation))
        assert len(plan.layers[0].heads) == 8 and len(plan.layers[0].neurons) == 48
        assert plan.ratio == pytest.approx(0.2, abs=0.01)
    scores[0].prunable_heads = scores[0].prunable_neurons = True
    plan = allocate(scores, adapter, costs, params, Budget(ratio=0.3, round_to=(2, 8)))
    for lp in plan.layers:
        assert len(lp.heads) % 2 == 0 and len(lp.neurons) % 8 == 0
    assert abs(plan.deviation) < 0.02 and plan.deviation == pytest.approx(
        plan.ratio - plan.target_removed / plan.block_params
    )


@pytest.mark.slow  # every criterion × reconstruction × model; each criterion has a reference test of its own
@pytest.mark.parametrize("name", ["llama", "qwen2", "bert"])
@pytest.mark.parametrize(
    ("criterion", "allocation", "modules"),
    [
        ({"name": "snip"}, "global", "both"),
        ({"name": "kwon"}, "global", "both"),
        ({"name": "kwon", "options": {"rearrange": False}}, "uniform", "both"),
        ({"name": "taylor"}, "uniform", "both"),
        ({"name": "taylor", "options": {"taylor": "param_mix", "mlp_layers": [1, 2]}}, "global", "both"),
        ({"name": "kcm"}, "uniform", "neurons"),
    ],
)
def test_every_criterion_runs_with_every_reconstruction(
    name, criterion, allocation, modules, model_dirs, corpus, labelled
):
    cal = {"dataset": str(labelled), "texts": None, "label_field": "label"} if name == "bert" else {}
    for method in sorted(METHODS):
        result = prune(
            recipe_for(
                model_dirs[name],
                corpus,
                ratio=0.3,
                modules=modules,
                allocation=allocation,
                criterion=criterion,
                calibration=cal,
                reconstruction={"method": method, "damp": 1e-3},
            )
        )
        assert result.plan.ratio == pytest.approx(0.3, abs=0.02)
        assert result.summary()["ratio_deviation"] == pytest.approx(result.achieved_ratio - 0.3, abs=1e-6)


@pytest.mark.parametrize(
    ("criterion", "modules", "message"),
    [
        ({"name": "taylor", "options": {"taylor": "hessian"}}, "both", "unknown taylor mode 'hessian'"),
        ({"name": "taylor", "options": {"aggregation": "mean"}}, "both", "unknown taylor aggregation"),
        ({"name": "taylor", "options": {"mlp_layers": [2, 1]}}, "both", "mlp_layers must be"),
        ({"name": "kcm"}, "both", "KCM scores FFN neurons only"),
        ({"name": "kcm", "options": {"sigma": -1}}, "neurons", "sigma must be a positive number"),
        ({"name": "snip", "options": {"samples": 0}}, "both", "samples must be a positive integer"),
        ({"name": "kwon", "options": {"fisher": 1}}, "both", "criterion 'kwon' has no option"),
        ({"name": "magnitude", "options": {"p": 1}}, "both", "criterion 'magnitude' has no option"),
    ],
)
def test_bad_criterion_options(criterion, modules, message, llama_dir, corpus):
    with pytest.raises(ValidationError, match=message):
        Recipe.model_validate(recipe_for(llama_dir, corpus, criterion=criterion, modules=modules))


def test_gradient_criteria_without_the_data_they_need(bert_dir, bert_qa_dir, llama_dir, corpus, labelled):
    with pytest.raises(ValueError, match="needs labelled calibration data"):
        prune(recipe_for(bert_dir, corpus, criterion={"name": "snip"}))
    with pytest.raises(ValueError, match="supports sequence-classification"):
        prune(recipe_for(bert_qa_dir, corpus, criterion={"name": "kwon"}))
    with pytest.raises(ValueError, match="samples=50 but the calibration has 12"):
        prune(recipe_for(llama_dir, corpus, criterion={"name": "snip", "options": {"samples": 50}}))
    with pytest.raises(ValueError, match="reaches past the model's 2 layers"):
        prune(recipe_for(llama_dir, corpus, criterion={"name": "taylor", "options": {"attention_layers": [0, 5]}}))
    with pytest.raises(ValidationError, match="label_field needs a .jsonl or .json"):
        Recipe.model_validate(recipe_for(llama_dir, corpus, calibration={"label_field": "label"}))
    with pytest.raises(ValueError, match="label_field applies to encoder models"):
        prune(
            recipe_for(llama_dir, corpus, calibration={"dataset": str(labelled), "texts": None, "label_field": "label"})
        )


@pytest.mark.slow
def test_scores_of_one_run_can_be_reused(llama_dir, corpus):
    """Scores depend on neither ratio nor reconstruction: passing them back gives the same prune."""
    first = prune(recipe_for(llama_dir, corpus, ratio=0.2, allocation="global", criterion={"name": "kwon"}))
    recipe = recipe_for(llama_dir, corpus, ratio=0.4, allocation="global", criterion={"name": "kwon"})
    fresh = prune(recipe)
    reused = prune(recipe, scores=first.scores)
    assert [lp.heads for lp in reused.plan.layers] == [lp.heads for lp in fresh.plan.layers]
    assert all(torch.equal(a.neurons, b.neurons) for a, b in zip(reused.plan.layers, fresh.plan.layers))
    ids = torch.tensor([[3, 5, 7, 9, 11]])
    torch.testing.assert_close(reused.model(ids).logits, fresh.model(ids).logits)
    with pytest.raises(ValueError, match="scores cover 1 layers but the model has 2"):
        prune(recipe, scores=first.scores[:1])


def test_auto_criterion_is_kwon_for_a_labelled_sequence_classifier(bert_dir, bert_qa_dir, corpus, labelled, tmp_path):
    """The encoder default with labelled calibration: Kwon et al.'s Fisher search with its own units
    (measured best on MiniLM); it needs whole-model gradients, so a run that would stream is kept in
    memory — and one that must stream keeps auto off gradients."""
    cal = {"dataset": str(labelled), "texts": None, "label_field": "label", "holdout_samples": 2}
    auto = {"method": "ls", "select": "auto"}  # the default (recipe_for names the paper's select)
    data = recipe_for(bert_dir, corpus, criterion={"name": "auto"}, reconstruction=auto, calibration=cal)
    result = prune(data, output_dir=tmp_path / "out")  # a model directory with an output: auto would stream
    ran = result.recipe
    assert (ran.criterion.name, ran.allocation, ran.reconstruction.select) == ("kwon", "global", "criterion")
    assert result.metrics["execution"] == "memory"
    recipe = Recipe.model_validate(data)
    assert recipe.resolved("encoder", pools_first=False).criterion.name == "magnitude"  # QA, embeddings
    for change in ({"modules": "heads"}, {"allocation": "uniform"}, {"execution": "stream"}):
        assert Recipe.model_validate(data | change).resolved("encoder", True).criterion.name != "kwon"
    explicit = data | {"reconstruction": {"method": "ls", "select": "obs"}}
    assert Recipe.model_validate(explicit).resolved("encoder", True).reconstruction.select == "obs"
    unlabelled = recipe_for(bert_dir, corpus, criterion={"name": "auto"}, reconstruction=auto)
    assert Recipe.model_validate(unlabelled).resolved("encoder", True).criterion.name == "magnitude"
    qa = prune(data | {"model": str(bert_qa_dir)})  # a question-answering head reads every position
    assert qa.recipe.criterion.name == "magnitude"
