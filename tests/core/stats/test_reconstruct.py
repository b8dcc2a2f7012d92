"""Every reconstruction formula against a slow, obvious reference on raw activations (numpy, float64)."""

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from core.stats.accumulate import InputStats
from core.stats.reconstruct import (
    METHODS,
    gram_block,
    project_rows,
    reconstruct_from_stats,
    reconstruct_linear,
    relative_output_error,
)
from core.stats.spd_inverse import inverse_spd, solve_spd, solve_spd_in_place

ROOT = Path(__file__).resolve().parents[3]

RTOL = 1e-6


def _problem(n=400, c_in=24, c_out=10, n_keep=15, seed=0, bias=True, correlated=True):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(n, c_in))
    if correlated:  # pruned channels partly predictable from kept ones, plus an offset (non-zero mean)
        x = x @ rng.normal(size=(c_in, c_in)) * 0.5 + x + rng.normal(size=c_in)
    w = rng.normal(size=(c_out, c_in))
    b = rng.normal(size=c_out) if bias else None
    keep = np.zeros(c_in, dtype=bool)
    keep[rng.choice(c_in, n_keep, replace=False)] = True
    return x, w, b, keep


def _t(a):
    return None if a is None else torch.from_numpy(np.asarray(a))


def _run(method, x, w, b, keep, **kw):
    nw, nb = reconstruct_linear(method, _t(x), _t(w), _t(b), torch.from_numpy(keep), **kw)
    return nw.numpy(), nb.numpy()


def _close(a, b):
    scale = max(np.abs(b).max(), 1e-12)
    assert np.abs(a - b).max() / scale < RTOL, np.abs(a - b).max() / scale


# ----- slow references, written from the paper's definitions on raw X --------------------------
def ref_liar(x, w, b, keep):
    u, m = keep, ~keep
    wp = w.T  # paper layout (C_in, C_out)
    xu, xm = x[:, u], x[:, m]
    mu_m = xm.mean(0)
    q = np.linalg.lstsq(xu, xm - mu_m, rcond=None)[0]  # argmin ‖X_m − (X_u Q + X̄_m)‖
    p = np.linalg.lstsq(wp[u].T, wp[m].T, rcond=None)[0].T  # argmin ‖W_m − P W_u‖
    new = (np.eye(u.sum()) + q @ p) @ wp[u]
    return new.T, (0 if b is None else b) + mu_m @ wp[m]


def ref_ls(x, w, b, keep):
    """min over W', B' of ‖X W + B − X_u W' − B'‖² by lstsq on [X_u, 1]."""
    target = x @ w.T + (0 if b is None else b)
    design = np.hstack([x[:, keep], np.ones((len(x), 1))])
    sol = np.linalg.lstsq(design, target, rcond=None)[0]
    return sol[:-1].T, sol[-1]


def ref_mask_tuning(x, w, b, keep, group=1):
    """min over per-group scales α of ‖X W − Σ_g α_g X_g W_g‖² (no bias change)."""
    target = (x @ w.T).ravel()
    kept = np.flatnonzero(keep)
    groups = sorted(set(kept // group))
    cols = []
    for g in groups:
        ch = kept[kept // group == g]
        cols.append((x[:, ch] @ w[:, ch].T).ravel())
    alpha = np.linalg.lstsq(np.stack(cols, 1), target, rcond=None)[0]
    scale = np.array([alpha[groups.index(c // group)] for c in kept])
    return w[:, keep] * scale[None, :], b


@pytest.mark.parametrize("bias", [True, False])
def test_none_and_bias_match_definitions(bias):
    x, w, b, keep = _problem(bias=bias)
    nw, nb = _run("none", x, w, b, keep)
    _close(nw, w[:, keep])
    _close(nb, b if bias else np.zeros(w.shape[0]))
    nw, nb = _run("bias", x, w, b, keep)
    _close(nw, w[:, keep])
    _close(nb, (b if bias else 0) + w[:, ~keep] @ x[:, ~keep].mean(0))


@pytest.mark.parametrize("shape", [(24, 10, 15), (24, 30, 15), (16, 6, 4)])  # |u| ≥ C_out and |u| < C_out
@pytest.mark.parametrize("bias", [True, False])
def test_liar_matches_paper(shape, bias):
    c_in, c_out, n_keep = shape
    x, w, b, keep = _problem(c_in=c_in, c_out=c_out, n_keep=n_keep, bias=bias)
    nw, nb = _run("liar", x, w, b, keep)
    rw, rb = ref_liar(x, w, b, keep)
    _close(nw, rw)
    _close(nb, rb)


@pytest.mark.parametrize("shape", [(24, 10, 15), (24, 30, 15)])
def test_ls_is_exact_affine_least_squares(shape):
    c_in, c_out, n_keep = shape
    x, w, b, keep = _problem(c_in=c_in, c_out=c_out, n_keep=n_keep)
    nw, nb = _run("ls", x, w, b, keep)
    rw, rb = ref_ls(x, w, b, keep)
    _close(nw, rw)
    _close(nb, rb)


@pytest.mark.parametrize("group", [1, 4])
def test_mask_tuning_matches_least_squares_scales(group):
    x, w, b, keep = _problem(c_in=24, c_out=10)
    if group > 1:  # keep whole heads of `group` channels
        heads = np.array([1, 0, 1, 1, 0, 1], dtype=bool)
        keep = np.repeat(heads, group)
    nw, nb = _run("mask_tuning", x, w, b, keep, group_size=group)
    rw, rb = ref_mask_tuning(x, w, b, keep, group)
    _close(nw, rw)
    _close(nb, rb)


def test_ls_is_optimal_on_fit_data():
    """No method beats the exact least-squares refit on the tokens it was fitted to."""
    x, w, b, keep = _problem(c_in=32, c_out=12, n_keep=12)
    stats = InputStats.from_tensor(_t(x))
    errs = {}
    for m in METHODS:
        nw, nb = reconstruct_from_stats(m, _t(w), _t(b), torch.from_numpy(keep), stats, group_size=1)
        errs[m] = relative_output_error(_t(w), _t(b), torch.from_numpy(keep), nw, nb, stats)
    assert all(errs["ls"] <= e + 1e-12 for e in errs.values()), errs
    assert errs["liar"] < errs["bias"] < errs["none"], errs


def test_liar_equals_ls_for_centred_inputs_with_full_rank_kept_weights():
    """With μ = 0 and |u| ≥ C_out (W_u full column rank), LIAR and the affine LS refit coincide."""
    x, w, b, keep = _problem(c_in=24, c_out=8, n_keep=16)
    x = x - x.mean(0)
    lw, lb = _run("liar", x, w, b, keep)
    sw, sb = _run("ls", x, w, b, keep)
    _close(lw, sw)
    _close(lb, sb)


def test_relative_error_matches_raw_computation():
    x, w, b, keep = _problem()
    nw, nb = _run("liar", x, w, b, keep)
    full = x @ w.T + b
    approx = x[:, keep] @ nw.T + nb
    expected = ((full - approx) ** 2).sum() / (full**2).sum()
    got = relative_output_error(_t(w), _t(b), torch.from_numpy(keep), _t(nw), _t(nb), InputStats.from_tensor(_t(x)))
    assert got == pytest.approx(expected, rel=1e-9)


def test_project_rows_is_the_least_squares_projection():
    rng = np.random.default_rng(3)
    for r, d in ((5, 12), (12, 5), (4, 4)):
        basis, target = rng.normal(size=(r, d)), rng.normal(size=(3, d))
        p = np.linalg.lstsq(basis.T, target.T, rcond=None)[0].T
        _close(project_rows(_t(target), _t(basis)).numpy(), p @ basis)


def test_project_rows_by_cholesky_equals_the_eigendecomposition_path_and_handles_low_rank():
    """The Cholesky path (no eigendecomposition) against the rank-revealing eigh path and numpy's
    least-squares projection, for full-rank and rank-deficient bases on both sides of r = d."""
    from core.stats.reconstruct import _eigh_projection

    rng = np.random.default_rng(7)
    for r, d, rank in ((6, 20, 6), (30, 8, 8), (10, 10, 10), (6, 20, 3), (30, 8, 5)):
        basis = rng.normal(size=(r, rank)) @ rng.normal(size=(rank, d))  # rank-deficient when rank < min
        target = rng.normal(size=(4, d))
        ref = np.linalg.lstsq(basis.T, target.T, rcond=None)[0].T @ basis
        got = project_rows(_t(target), _t(basis))
        _close(got.numpy(), ref)
        _close(got.numpy(), _eigh_projection(_t(target), _t(basis)).numpy())


def test_error_tensors_equal_the_direct_formula_without_and_with_bias():
    """The expanded closed form (one C_in² product shared by the candidates) against ‖XW+B − X_uW'−B'‖²
    on raw activations, for a layer with and without a bias and candidates with and without one."""
    from core.stats.reconstruct import relative_output_error_tensors

    x, w, b, keep = _problem()
    kt = torch.from_numpy(keep)
    for bias in (b, None):
        nw, nb = _run("liar", x, w, bias if bias is not None else np.zeros(w.shape[0]), keep)
        cands = [(_t(w[:, keep]), None), (_t(nw), _t(nb))]
        got = relative_output_error_tensors(
            _t(w), None if bias is None else _t(bias), kt, cands, InputStats.from_tensor(_t(x))
        )
        b0 = np.zeros(w.shape[0]) if bias is None else bias
        full = x @ w.T + b0
        for (cw, cb), value in zip([(w[:, keep], None), (nw, nb)], got):
            approx = x[:, keep] @ cw.T + (b0 if cb is None and bias is not None else (0 if cb is None else cb))
            expected = ((full - approx) ** 2).sum() / (full**2).sum()
            assert float(value) == pytest.approx(expected, rel=1e-9, abs=1e-14)


def test_solve_spd_damping_and_dead_channels():
    rng = np.random.default_rng(1)
    a = rng.normal(size=(50, 6))
    a[:, 2] = 0.0  # a dead channel
    g = a.T @ a
    rhs = rng.normal(size=(6, 2))
    rhs[2] = 0.0
    sol = solve_spd(_t(g), _t(rhs), damp=0.1).numpy()
    live = [0, 1, 3, 4, 5]
    lam = 0.1 * np.mean(np.where(np.diag(g) > 0, np.diag(g), 1.0))
    expected = np.linalg.solve(g[np.ix_(live, live)] + lam * np.eye(5), rhs[live])
    _close(sol[live], expected)
    assert np.all(sol[2] == 0)


def test_solve_spd_falls_back_on_singular_matrix():
    rng = np.random.default_rng(2)
    a = rng.normal(size=(3, 8))  # rank 3 Gram of size 8: singular
    g = a.T @ a
    rhs = g @ rng.normal(size=(8, 1))
    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        sol = solve_spd(_t(g), _t(rhs), damp=0.0).numpy()
    np.testing.assert_allclose(g @ sol, rhs, rtol=1e-4, atol=1e-6)


def test_inverse_spd_in_place_equals_the_damped_inverse():
    rng = np.random.default_rng(3)
    a = rng.normal(size=(60, 9))
    a[:, 4] = 0.0  # a dead channel: unit row and column, as in solve_spd
    g = a.T @ a
    built = []

    def build():
        built.append(_t(g).clone())
        return built[-1]

    inv = inverse_spd(build, damp=0.05)
    assert len(built) == 1 and inv.data_ptr() == built[0].data_ptr()  # in the temporary's memory
    live = [0, 1, 2, 3, 5, 6, 7, 8]
    lam = 0.05 * np.mean(np.where(np.diag(g) > 0, np.diag(g), 1.0))
    expected = np.linalg.inv(g[np.ix_(live, live)] + lam * np.eye(8))
    _close(inv.numpy()[np.ix_(live, live)], expected)
    assert float(inv[4, 4]) == pytest.approx(1 / (1 + lam)) and np.all(np.delete(inv.numpy()[4], 4) == 0)
    assert torch.equal(inv, inv.T)


def test_inverse_spd_retries_on_a_second_build_when_the_factorisation_fails():
    rng = np.random.default_rng(4)
    a = rng.normal(size=(3, 8))
    g = a.T @ a - 1e-3 * np.eye(8)  # indefinite: the first in-place factorisation fails
    calls = []

    def build():
        calls.append(1)
        return _t(g).clone()

    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        inv = inverse_spd(build, damp=0.0)
    assert len(calls) == 2
    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        expected = solve_spd(_t(g), None, damp=0.0)
    assert torch.equal(inv, expected)
    with pytest.raises(TypeError, match="float64"):
        inverse_spd(lambda: torch.eye(3), 0.0)


_PEAK = """
import re, torch
from core.stats.spd_inverse import inverse_spd, solve_spd_in_place

def hwm():
    return int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1)) / 1024

n = 3000
g = torch.randn(n, n, dtype=torch.float64).mul_(0.01)
g.diagonal().add_(float(n))  # diagonally dominant: positive definite
rhs = torch.randn(n, 30, dtype=torch.float64)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # the peak from here on
base = hwm()
out = {call}
print((hwm() - base) / (n * n * 8 / 2**20))
"""


def _peak_in_matrices(call: str) -> float:
    """The resident peak of ``call`` (on a 3000² float64 ``g`` and a 3000 × 30 ``rhs``), beyond what
    was resident before it, in units of the matrix (a fresh process)."""
    script = _PEAK.replace("{call}", call)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    return float(out.stdout)


@pytest.mark.slow
def test_inverse_spd_peaks_at_one_matrix_beyond_its_input():
    # the copy only, and the allocator's and LAPACK's slack (up to 1.33 seen on a loaded machine); a factor
    # and an inverse beside it would make 2–3
    assert _peak_in_matrices("inverse_spd(lambda: g.clone(), 1e-3)") < 1.5


def test_solve_spd_in_place_equals_the_damped_solve_in_the_temporarys_memory():
    rng = np.random.default_rng(5)
    a = rng.normal(size=(80, 12))
    a[:, 7] = 0.0  # a dead channel: unit row and column, as in solve_spd
    g = a.T @ a
    rhs = rng.normal(size=(12, 5))
    built = []

    def build():
        built.append(_t(g).clone())
        return built[-1]

    sol = solve_spd_in_place(build, _t(rhs), damp=0.05)
    assert len(built) == 1
    lam = 0.05 * np.mean(np.where(np.diag(g) > 0, np.diag(g), 1.0))
    conditioned = g + lam * np.eye(12)
    conditioned[7, 7] = 1.0 + lam
    _close(sol.numpy(), np.linalg.solve(conditioned, rhs))
    _close(sol.numpy(), solve_spd(_t(g), _t(rhs), damp=0.05).numpy())


def test_solve_spd_in_place_retries_on_a_second_build_when_the_factorisation_fails():
    rng = np.random.default_rng(6)
    a = rng.normal(size=(3, 8))
    g = a.T @ a - 1e-3 * np.eye(8)  # indefinite: the first in-place factorisation fails
    rhs = _t(rng.normal(size=(8, 2)))
    calls = []

    def build():
        calls.append(1)
        return _t(g).clone()

    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        sol = solve_spd_in_place(build, rhs, damp=0.0)
    assert len(calls) == 2
    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        expected = solve_spd(_t(g), rhs, damp=0.0)
    assert torch.equal(sol, expected)


def test_released_statistics_go_once_the_block_is_factorised_and_serve_a_retry_until_then():
    rng = np.random.default_rng(7)
    a = rng.normal(size=(3, 8))
    stats = InputStats.from_tensor(_t(a))  # rank 3 of 8: not positive definite undamped
    seen = []

    def make():
        seen.append(stats.gram is not None)
        return stats.gram.clone()

    build, factored = gram_block(make, stats, release=True)
    with pytest.warns(RuntimeWarning, match="Cholesky failed"):
        solve_spd_in_place(build, _t(np.ones((8, 1))), 0.0, factored)
    assert seen == [True, True] and stats.gram is None  # the retry's block came from the statistics
    ok = InputStats.from_tensor(_t(rng.normal(size=(40, 8))))
    build, factored = gram_block(lambda: ok.gram.clone(), ok, release=True)
    solve_spd_in_place(build, _t(np.ones((8, 1))), 0.0, factored)
    assert ok.gram is None
    kept = InputStats.from_tensor(_t(rng.normal(size=(40, 8))))
    build, factored = gram_block(lambda: kept.gram.clone(), kept, release=False)
    assert factored is None and torch.equal(build(), kept.gram)


@pytest.mark.parametrize("method", ["liar", "ls"])
def test_releasing_the_statistics_does_not_change_the_refit(method):
    x, w, b, keep = _problem()
    results = []
    for release in (False, True):
        stats = InputStats.from_tensor(_t(x))
        results.append(
            reconstruct_from_stats(method, _t(w), _t(b), torch.as_tensor(keep), stats, 1e-3, release=release)
        )
        assert (stats.gram is None) == release
    assert all(torch.equal(p, q) for p, q in zip(*results, strict=True))


@pytest.mark.slow
def test_solve_spd_in_place_peaks_at_one_matrix_beyond_its_input():
    # the copy only; a factor beside it and the solve's copy would make 3
    assert _peak_in_matrices("solve_spd_in_place(lambda: g.clone(), rhs, 1e-3)") < 1.3


@pytest.mark.parametrize("method", sorted(METHODS))
def test_keep_all_is_identity(method):
    x, w, b, _ = _problem()
    keep = np.ones(x.shape[1], dtype=bool)
    nw, nb = _run(method, x, w, b, keep)
    _close(nw, w)
    _close(nb, b)


def test_bad_arguments_are_rejected():
    x, w, b, keep = _problem()
    with pytest.raises(ValueError, match="unknown reconstruction method 'foo'"):
        _run("foo", x, w, b, keep)
    with pytest.raises(ValueError, match="keep selects no input channel"):
        _run("liar", x, w, b, np.zeros_like(keep))
    with pytest.raises(ValueError, match="x must be"):
        reconstruct_linear("liar", _t(x[:, :3]), _t(w), _t(b), torch.from_numpy(keep))
    with pytest.raises(ValueError, match="damp must be >= 0"):
        _run("liar", x, w, b, keep, damp=-1.0)


def test_float32_inputs_return_float32():
    x, w, b, keep = _problem()
    nw, nb = reconstruct_linear("ls", _t(x).float(), _t(w).float(), _t(b).float(), torch.from_numpy(keep))
    assert nw.dtype == torch.float32 and nb.dtype == torch.float32
    rw, _ = ref_ls(x, w, b, keep)
    np.testing.assert_allclose(nw.numpy(), rw, rtol=1e-3, atol=1e-3)


def test_gpu_error_report_path_agrees_with_float64():
    """The direct float32/TF32 form the error report uses on a GPU (run here on the CPU, in float32)
    against the float64 closed form, for the naive and the reconstructed candidate."""
    from core.stats.reconstruct import _error_tensors_tf32, relative_output_error_tensors

    x, w, b, keep = _problem()
    kt = torch.from_numpy(keep)
    nw, nb = _run("liar", x, w, b, keep)
    cands = [(_t(w[:, keep]), _t(b)), (_t(nw), _t(nb))]
    stats = InputStats.from_tensor(_t(x))
    ref = relative_output_error_tensors(_t(w), _t(b), kt, cands, stats)
    got = _error_tensors_tf32(_t(w), _t(b), kt, cands, stats)
    for r, g in zip(ref, got):
        assert float(g) == pytest.approx(float(r), rel=1e-4)


def test_held_aside_error_report_against_float64_direct_formula():
    """The report on raw held-aside inputs: float64 inputs give ‖XW+B − X_uW'−B'‖² / ‖XW+B‖² to
    float64 accuracy; float32 inputs (products in float32) to ~1e-6 relative — also for a candidate
    whose error is tiny, where forming both outputs and subtracting would cancel; and a layer with
    no bias whose candidate adds one."""
    from core.stats.reconstruct import relative_output_error_from_inputs

    x, w, b, keep = _problem()
    kt = torch.from_numpy(keep)
    nw, nb = _run("liar", x, w, b, keep)
    rng = np.random.default_rng(3)
    near = w[:, keep] + 1e-5 * rng.normal(size=w[:, keep].shape)  # differs from the kept columns a little
    x_near = x.copy()
    x_near[:, ~keep] = 0.0  # on inputs whose pruned channels are silent, `near` is almost exact
    for inputs, bias, cands in [
        (x, b, [(w[:, keep], None), (nw, nb)]),
        (x, None, [(w[:, keep], None), (nw, nb)]),
        (x_near, b, [(near, None)]),
    ]:
        b0 = np.zeros(w.shape[0]) if bias is None else bias
        full = inputs @ w.T + b0
        expected = []
        for cw, cb in cands:
            approx = inputs[:, keep] @ cw.T + (b0 if cb is None else cb)
            expected.append(((full - approx) ** 2).sum() / (full**2).sum())
        tb = None if bias is None else _t(bias)
        tc = [(_t(cw), None if cb is None else _t(cb)) for cw, cb in cands]
        exact = relative_output_error_from_inputs(_t(w), tb, kt, tc, _t(inputs))
        single = relative_output_error_from_inputs(_t(w), tb, kt, tc, _t(inputs).float())
        for e, d, s in zip(expected, exact, single):
            assert d.dtype == torch.float64 and s.dtype == torch.float64
            assert float(d) == pytest.approx(e, rel=1e-10, abs=1e-300)
            assert float(s) == pytest.approx(e, rel=2e-6, abs=1e-300)
    assert expected[0] < 1e-8  # the cancelling case really is small


_REFIT_PEAK = """
import json, tempfile, torch
from torch.profiler import ProfilerActivity, profile
from core.stats.accumulate import InputStats
from core.stats.reconstruct import reconstruct_from_stats

n, method, release = 3000, "{method}", {release}
weight = torch.randn(n * 3 // 8, n).mul_(0.02).to(torch.bfloat16)  # an FFN's down projection's proportions
keep = torch.rand(n, generator=torch.Generator().manual_seed(0)) < 0.8

def refit():
    stats = InputStats(n, torch.float64)
    g = torch.full((n, n), 0.5, dtype=torch.float64)  # symmetric positive definite, made in place
    g.diagonal().add_(float(n))
    stats._gram, stats.count = g, 10 * n
    del g
    return reconstruct_from_stats(method, weight, None, keep, stats, 1e-3, release=release)

# the allocator's record of every allocation and free (one profile per process: exact)
with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
    refit()
with tempfile.TemporaryDirectory() as tmp:
    prof.export_chrome_trace(tmp + "/trace.json")
    events = json.load(open(tmp + "/trace.json"))["traceEvents"]
peak = max(e["args"]["Total Allocated"] for e in events if e.get("name") == "[memory]")
print(peak / (n * n * 8))
"""


@pytest.mark.slow
@pytest.mark.parametrize("method", ["liar", "ls"])
@pytest.mark.parametrize("release", [False, True])
def test_a_refit_holds_what_the_activation_planner_counts(method, release):
    """``core.models.offload.REFIT_MATRICES`` (what ``activations: auto`` sets aside for a block's
    solves, in C × C float64 matrices) bounds a refit's peak, its Gram included."""
    from core.models.offload import REFIT_MATRICES

    script = _REFIT_PEAK.replace("{method}", method).replace("{release}", str(release))
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=ROOT, check=True)
    assert float(out.stdout.splitlines()[-1]) <= REFIT_MATRICES, out.stdout
