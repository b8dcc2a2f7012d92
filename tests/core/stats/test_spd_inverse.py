"""The in-place inverse from a Cholesky factor (what a GPU runs instead of torch's cloning one)
against numpy's inverse in float64, and the pipeline's selection with it against LAPACK's potri."""

import numpy as np
import pytest
import torch

from core.stats import spd_inverse
from core.stats.accumulate import InputStats
from core.stats.select import obs_curve
from core.stats.spd_inverse import cholesky_inverse_


def _spd(n, seed=0, ridge=1e-3):
    rng = np.random.default_rng(seed)
    a = rng.normal(size=(n, n + 3))
    return a @ a.T / n + ridge * np.eye(n)


@pytest.mark.parametrize(("n", "base"), [(1, 4), (5, 8), (9, 4), (200, 16), (333, 64), (700, 512)])
@pytest.mark.parametrize("layout", ["row-major", "column-major"])
def test_the_in_place_inverse_equals_numpys(n, base, layout):
    """Odd sizes split unevenly at every level; a column-major factor is what inverse_spd passes."""
    m = _spd(n, seed=n)
    chol = torch.linalg.cholesky(torch.from_numpy(m))
    t = chol.clone() if layout == "row-major" else chol.T.contiguous().T
    ptr = t.data_ptr()
    out = cholesky_inverse_(t, base)
    assert out is t and t.data_ptr() == ptr  # in the factor's memory
    want = np.linalg.inv(m)
    np.testing.assert_allclose(t.numpy(), want, rtol=0, atol=1e-10 * np.abs(want).max())
    assert torch.equal(t, t.T)  # exactly symmetric, as LAPACK's


def test_an_ill_conditioned_inverse_is_as_accurate_as_lapacks():
    """Damped like the solves (condition number ~1e6): the residual ‖M X − I‖ of the blocked inverse is
    within a small factor of LAPACK's potri on the same factor."""
    m = torch.from_numpy(_spd(600, seed=3, ridge=1e-6))
    chol = torch.linalg.cholesky(m)
    ours = cholesky_inverse_(chol.clone(), 64)
    lapack = torch.cholesky_inverse(chol)
    eye = torch.eye(600, dtype=torch.float64)
    res = lambda x: float((m @ x - eye).abs().max())  # noqa: E731
    assert res(ours) < 10 * res(lapack) + 1e-12


def test_the_selection_with_the_in_place_inverse_equals_lapacks(monkeypatch):
    """inverse_spd (the OBS paths' inverse) through the GPU's branch, on a CPU: the same path and errors."""
    rng = np.random.default_rng(1)
    x = rng.normal(size=(400, 40)) @ rng.normal(size=(40, 40)) + rng.normal(size=40)
    w = torch.from_numpy(rng.normal(size=(7, 40)))

    def curve():
        s = InputStats(40, torch.float64)
        s.add_batch(torch.from_numpy(x))
        return obs_curve(w, s, 30, 1, 1e-3, step=3)

    want = curve()
    calls = []
    monkeypatch.setattr(spd_inverse, "IN_PLACE_POTRI", frozenset())
    monkeypatch.setattr(spd_inverse, "cholesky_inverse_", lambda t: calls.append(t.shape) or cholesky_inverse_(t, 8))
    got = curve()
    assert calls == [(40, 40)]
    assert got.order == want.order and got.removed == want.removed
    np.testing.assert_allclose(got.error, want.error, rtol=1e-9, atol=1e-12)


def test_a_non_square_matrix_is_refused():
    with pytest.raises(ValueError, match="square"):
        cholesky_inverse_(torch.zeros(3, 4, dtype=torch.float64))
