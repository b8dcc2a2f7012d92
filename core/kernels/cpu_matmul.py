"""Float32 matrix products on a CPU through oneDNN's kernels instead of the BLAS torch calls.

torch multiplies float32 CPU matrices with the BLAS it was built with (MKL in the official wheels).
MKL picks its kernels by the CPU's vendor: on an AMD EPYC with AVX-512 it runs AVX2 code at
≈ 190 GFLOP/s on 2 cores, while oneDNN — the other library in the same wheel, whose JIT kernels
are chosen by the instruction set alone — runs the same float32 products at 400–480 GFLOP/s
(``docs/results/cpu_matmul.md``). On a CPU without AVX-512 the two are even or the BLAS is ahead.

Nothing here changes torch or the process by itself. An application (the ``liar`` CLI, a job
worker) opts in once with :func:`configure` (``LIAR_CPU_MATMUL``: ``auto``, ``onednn`` or
``blas``); code that never calls it — a library user's own ``core.prune`` — multiplies with torch's
BLAS everywhere. Once configured to oneDNN:

- :func:`route_linears` gives the ``nn.Linear`` instances of one model a forward of their own (an
  instance attribute, as accelerate's hooks are) for the length of a run, and removes exactly those
  on exit: ``torch.nn.Linear.forward`` itself is never reassigned, other models and any forward set
  on an instance before are left alone;
- :func:`gram_tn`, which the engine calls for its Gram statistics, multiplies through oneDNN.

``auto`` chooses oneDNN only when a one-time timing on this CPU (:func:`measure_rates`) finds it at
least :data:`MIN_GAIN` faster than the BLAS, after a product checked against float64.

The results are float32 products with float32 accumulation either way (no reduced-precision math:
oneDNN's default ``fpmath`` mode is strict); only the order of the sums differs, as between two BLAS
libraries. Its float32 sums run sequentially along the reduced dimension, so products over tokens
(Gram statistics) are taken in chunks of ``REDUCE_CHUNK`` tokens, which keeps their error at the
BLAS's. oneDNN runs a column-strided input or a non-contiguous weight through a slow reference path
(seconds for one product), so such calls stay with the BLAS. The op, ``mkldnn._linear_pointwise``,
is the one torch's own compiler emits for CPU linears; should a torch lack it or change it, the
check at configuration falls back to the BLAS.
"""

from __future__ import annotations

import os
import threading
import time
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

ENV = "LIAR_CPU_MATMUL"
CHOICES = ("auto", "onednn", "blas")
_CHECK_TOLERANCE = 1e-5  # relative, against a float64 product; float32 rounding is ~1e-7
# Products smaller than this many multiply-adds stay with the BLAS: oneDNN spends ~10 µs more a call
# and compiles a kernel for each new shape (0.5–50 ms), which a small product never earns back (a
# 128 × 576 × 576 product is already 2× faster through oneDNN; a decoding step's 1 × 576 × 576 is not)
MIN_MACS = 2**24
# oneDNN sums a float32 product's k terms one after another (its error grows with k: 3.3e-7 relative
# for a 2048-token Gram where the BLAS's is 8e-8), so products over tokens run in chunks of this many
# tokens whose partial products are summed: 9.5e-8, as fast (docs/results/cpu_matmul.md)
REDUCE_CHUNK = 256
# auto takes oneDNN only when it is at least this much faster: a tie is not worth a second library
MIN_GAIN = 1.10
# what auto times, both ways: a projection (2048 tokens, 1024 → 1024) and a Gram over 2048 tokens
# of 1024 channels — the two kinds of product a CPU run is made of
TIMED_TOKENS, TIMED_CHANNELS, TIMED_REPEATS = 2048, 1024, 3


@dataclass(frozen=True)
class Decision:
    """What this process multiplies float32 CPU matrices with, and why.

    ``requested``: what the application configured (``None``: nothing, a library caller); ``backend``:
    ``"onednn"`` or ``"blas"``; ``onednn_gflops`` / ``blas_gflops``: the rates ``auto`` measured
    (None when it did not time); ``reason``: one sentence for logs and job records."""

    requested: str | None
    backend: str
    onednn_gflops: float | None = None
    blas_gflops: float | None = None
    reason: str = ""

    def metrics(self) -> dict:
        """The decision as flat metrics (a job's record, a benchmark's row)."""
        return {
            "cpu_matmul": self.backend,
            "cpu_matmul_requested": self.requested or "unset",
            "cpu_matmul_onednn_gflops": self.onednn_gflops,
            "cpu_matmul_blas_gflops": self.blas_gflops,
        }


_lock = threading.Lock()
_requested: str | None = None  # None: no application configured this process: the BLAS everywhere
_decision: Decision | None = None


def _onednn_op():
    mkldnn = getattr(torch.ops, "mkldnn", None)
    return getattr(mkldnn, "_linear_pointwise", None) if mkldnn is not None else None


def configure(choice: str | None = None) -> None:
    """An application's choice for its process (``None``: ``LIAR_CPU_MATMUL``, default ``auto``).
    Cheap: the check and timing run at first use (:func:`decision`). Raises ValueError, in one
    sentence, for an unknown choice."""
    global _requested, _decision
    source = ENV if choice is None else "the CPU matmul choice"
    raw = os.environ.get(ENV, "auto") if choice is None else choice
    value = raw.strip().lower() or "auto"
    if value not in CHOICES:
        raise ValueError(f"{source} must be one of {', '.join(CHOICES)}, not {raw!r}")
    with _lock:
        if value != _requested:
            _requested, _decision = value, None


def reset() -> None:
    """Back to an unconfigured process (the BLAS everywhere); the next :func:`configure` decides again."""
    global _requested, _decision
    with _lock:
        _requested, _decision = None, None


def decision() -> Decision:
    """The process's :class:`Decision`, made once (on first use after :func:`configure`)."""
    global _decision
    with _lock:
        if _decision is None:
            _decision = _decide(_requested)
        return _decision


def backend() -> str:
    """``"onednn"`` or ``"blas"``: which library this process multiplies float32 CPU matrices with."""
    found = _decision  # set once; the lock only when it must be made
    return (found or decision()).backend


def _decide(requested: str | None) -> Decision:
    if requested is None:
        return Decision(None, "blas", reason="not configured by an application: torch's BLAS")
    if requested == "blas":
        return Decision(requested, "blas", reason=f"{ENV}=blas")
    if not torch.backends.mkldnn.is_available() or _onednn_op() is None:
        return Decision(requested, "blas", reason="this torch has no oneDNN linear op")
    if not _agrees():
        return Decision(requested, "blas", reason="oneDNN's product disagreed with float64 on this machine")
    if requested == "onednn":
        return Decision(requested, "onednn", reason=f"{ENV}=onednn")
    onednn, blas = measure_rates()
    faster = onednn >= MIN_GAIN * blas
    verdict = "faster" if faster else f"not {MIN_GAIN - 1:.0%} faster"
    reason = f"oneDNN {onednn:.0f} against the BLAS's {blas:.0f} GFLOP/s on this CPU: {verdict}"
    return Decision(requested, "onednn" if faster else "blas", onednn, blas, reason)


def _agrees() -> bool:
    """One small product with a bias, compared with float64: the op exists, runs and is exact."""
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*shape, generator=g) for shape in ((3, 40, 72), (56, 72), (56,)))
    try:
        y = _onednn_op()(x, w, b, "none", [], "")
    except RuntimeError:
        return False
    ref = F.linear(x.double(), w.double(), b.double())
    return y.shape == ref.shape and bool((y.double() - ref).norm() <= _CHECK_TOLERANCE * ref.norm())


@torch.no_grad()
def measure_rates(repeats: int = TIMED_REPEATS) -> tuple[float, float]:
    """``(oneDNN, BLAS)`` GFLOP/s on this CPU with the current thread count: a projection and a
    chunked Gram through each library, each product's best of ``repeats`` runs after a warm-up, the
    two libraries' runs interleaved (a burst of load from another process hits both alike). ~0.5 s."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(TIMED_TOKENS, TIMED_CHANNELS, generator=g)
    w = torch.randn(TIMED_CHANNELS, TIMED_CHANNELS, generator=g)
    op = _onednn_op()
    products = {
        "onednn": (
            lambda: op(x, w, None, "none", [], ""),
            lambda: _gram_onednn(x, x, [(0, TIMED_CHANNELS)], True, same=True),
        ),
        "blas": (lambda: F.linear(x, w), lambda: x.T @ x),
    }
    best = {(lib, i): float("inf") for lib in products for i in range(2)}
    for rep in range(repeats + 1):  # the first run of each is a warm-up: oneDNN compiles per shape
        for i in range(2):
            for lib, fns in products.items():
                t0 = time.perf_counter()
                fns[i]()
                if rep:
                    best[lib, i] = min(best[lib, i], time.perf_counter() - t0)
    flop = 2 * 2 * TIMED_TOKENS * TIMED_CHANNELS * TIMED_CHANNELS  # the Gram's equal the projection's
    return tuple(flop / (best[lib, 0] + best[lib, 1]) / 1e9 for lib in ("onednn", "blas"))


def _unit_stride(t: torch.Tensor) -> bool:
    return t.dim() >= 1 and t.stride(-1) == 1 and t.numel() > 0


def takes(x: torch.Tensor, dtype: torch.dtype = torch.float32) -> bool:
    """Whether products of ``x`` (a CPU tensor) in ``dtype`` go to oneDNN in this process."""
    return x.device.type == "cpu" and x.dtype == torch.float32 and dtype == torch.float32 and backend() == "onednn"


def _chunks_t(x: torch.Tensor) -> Iterator[torch.Tensor]:
    """``(C, ≤ REDUCE_CHUNK)`` contiguous transposes of consecutive row (token) chunks of ``x``; the
    whole chunks in one batched copy (3× faster than one transpose a chunk at 1,536 channels)."""
    n, whole = x.shape[0], x.shape[0] // REDUCE_CHUNK * REDUCE_CHUNK
    if whole:
        yield from x[:whole].reshape(-1, REDUCE_CHUNK, x.shape[1]).transpose(1, 2).contiguous().unbind(0)
    if whole < n:
        yield x[whole:].T.contiguous()


def _gram_onednn(a, b, blocks: list[tuple[int, int]], full: bool, same: bool) -> list[torch.Tensor]:
    """oneDNN's products for :func:`gram_tn`: token chunks whose float32 partial products are summed."""
    op = _onednn_op()
    sums: list[torch.Tensor | None] = [None] * len(blocks)
    # one transposed copy of each chunk when the product is a Gram (b is a)
    chunks = ((at, at) for at in _chunks_t(a)) if same else zip(_chunks_t(a), _chunks_t(b))
    for at, bt in chunks:
        for i, (r0, r1) in enumerate(blocks):
            part = op(at[r0:r1], bt if full else bt[r0:], None, "none", [], "")
            sums[i] = part if sums[i] is None else sums[i].add_(part)
    return sums


def gram_tn(a: torch.Tensor, b: torch.Tensor | None = None, rows: list[tuple[int, int]] | None = None):
    """Products over the token dimension of float32 CPU matrices ``a``, ``b`` of shape ``(n, C)``:
    ``[a[:, r0:r1]ᵀ b[:, r0:] for (r0, r1) in rows]`` (the block rows of a Gram's upper triangle;
    ``b`` None: ``a``), or ``aᵀb`` when ``rows`` is None. Through oneDNN when :func:`takes` says so
    and the product has ``MIN_MACS`` multiply-adds: the tokens in chunks of ``REDUCE_CHUNK``, whose
    float32 partial products are summed; else torch's products."""
    same = b is None
    b = a if same else b
    blocks = rows or [(0, a.shape[1])]
    full = rows is None
    if takes(a) and b.dtype == torch.float32 and a.shape[0] * a.shape[1] * b.shape[1] >= MIN_MACS:
        out = _gram_onednn(a, b, blocks, full, same)
    else:
        out = [a[:, r0:r1].T @ (b if full else b[:, r0:]) for r0, r1 in blocks]
    return out[0] if full else out


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``F.linear`` through oneDNN where it can take the call (float32 CPU operands, the input of
    unit stride along its channels and at least 2-D, a contiguous weight, nothing needing gradients,
    ``MIN_MACS`` multiply-adds at least), else ``F.linear``."""
    if _eligible(x, weight, bias):
        return _onednn_op()(x, weight, bias, "none", [], "")
    return F.linear(x, weight, bias)


def _eligible(x, weight, bias) -> bool:
    if not (isinstance(x, torch.Tensor) and isinstance(weight, torch.Tensor)):
        return False
    if x.dim() < 2 or weight.dim() != 2 or x.shape[-1] != weight.shape[1] or weight.shape[0] == 0:
        return False
    if x.numel() * weight.shape[0] < MIN_MACS:
        return False
    if not (takes(x) and weight.dtype == torch.float32 and weight.device.type == "cpu"):
        return False
    if bias is not None and (bias.dtype != torch.float32 or bias.dim() != 1 or not bias.is_contiguous()):
        return False
    if not weight.is_contiguous():  # a window of a wider weight runs oneDNN's reference path (seconds)
        return False
    needs_grad = x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
    if torch.is_grad_enabled() and needs_grad:
        return False  # oneDNN's op has no backward
    return _unit_stride(x)


# the route: one model's nn.Linear instances, for the length of a run ----------------------------
class _Routed:
    """The forward a routed ``nn.Linear`` instance holds: :func:`linear` while its route is open and
    not lifted, the class's own forward otherwise. Holds its module weakly (no reference cycle keeps
    a weight a surgery replaced alive)."""

    __slots__ = ("module", "route", "stock")

    def __init__(self, module: nn.Linear, route: _Route):
        self.module, self.route, self.stock = weakref.ref(module), route, False

    def __call__(self, input: torch.Tensor) -> torch.Tensor:
        m = self.module()
        if self.stock or not self.route.open:
            return type(m).forward(m, input)
        return linear(input, m.weight, m.bias)

    def __deepcopy__(self, memo: dict) -> _Routed:
        """A model copied during a run: its copy is routed too, and unrouted on the same exit."""
        copy = memo.get(id(self.module()))
        return self.route.install(copy) if copy is not None else self


def _routable(m: nn.Module) -> bool:
    """A Linear running torch's own forward, with no forward of its own set on the instance."""
    return isinstance(m, nn.Linear) and type(m).forward is nn.Linear.forward and "forward" not in m.__dict__


class _Route:
    """The Linear instances of one model routed through oneDNN, and the forward pre-hooks that route
    those added later (a surgery's new projections, checked each time their parent runs)."""

    def __init__(self) -> None:
        self.open = True
        self.routed: weakref.WeakSet[nn.Module] = weakref.WeakSet()
        self.hooks: weakref.WeakKeyDictionary[nn.Module, object] = weakref.WeakKeyDictionary()

    def install(self, m: nn.Linear) -> _Routed:
        forward = _Routed(m, self)
        m.__dict__["forward"] = forward  # shadows the class's forward for this instance only
        self.routed.add(m)
        return forward

    def adopt(self, root: nn.Module) -> None:
        for m in root.modules():
            if _routable(m):
                self.install(m)
            elif m._modules and m not in self.hooks and not isinstance(m, nn.Linear):
                self.hooks[m] = m.register_forward_pre_hook(self._before_call)

    def _before_call(self, module: nn.Module, args) -> None:
        if module in _lifted:  # timed as torch runs it: a new projection stays unrouted until after
            return
        for child in module._modules.values():
            if child is None:
                continue
            if _routable(child):
                self.install(child)
            elif child._modules and child not in self.hooks:
                self.adopt(child)

    def close(self) -> None:
        """Remove the hooks and exactly the forwards this route set (one set since by someone else stays)."""
        self.open = False
        for handle in list(self.hooks.values()):
            handle.remove()
        self.hooks.clear()
        for m in list(self.routed):
            forward = m.__dict__.get("forward")
            if isinstance(forward, _Routed) and forward.route is self:
                del m.__dict__["forward"]
        self.routed.clear()


@contextmanager
def route_linears(model: nn.Module, device: torch.device | str) -> Iterator[None]:
    """Inside, ``model``'s float32 ``nn.Linear`` products on a CPU go through oneDNN — when an
    application configured it and it was chosen (:func:`backend`); else, or for another ``device``,
    nothing is installed. Routes the Linear instances present now and, through forward pre-hooks on
    their parents, those added later (a pruned block's new projections, a streamed block's modules);
    on exit — returned or raised — removes exactly what it installed. ``nn.Linear.forward`` itself,
    other models, and a forward set on an instance by someone else are never touched."""
    if torch.device(device).type != "cpu" or backend() != "onednn":
        yield
        return
    route = _Route()
    try:
        route.adopt(model)
        yield
    finally:
        route.close()


@contextmanager
def lifted(module: nn.Module) -> Iterator[None]:
    """Inside, the routed Linears under ``module`` run their class's own forward (a speed measurement
    that must time what a user's stock model runs), and those added since are not routed meanwhile;
    routed again after."""
    modules = [m for m in module.modules() if m not in _lifted]
    stock = [f for m in modules if isinstance(f := m.__dict__.get("forward"), _Routed) and not f.stock]
    for f in stock:
        f.stock = True
    _lifted.update(modules)
    try:
        yield
    finally:
        for m in modules:
            _lifted.discard(m)
        for f in stock:
            f.stock = False


_lifted: weakref.WeakSet[nn.Module] = weakref.WeakSet()  # modules inside a :func:`lifted` block now
