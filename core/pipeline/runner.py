"""Running one block at a time on stored inputs, with hooks that stream a projection's inputs.

``BlockRunner`` keeps the hidden states entering the current block for every calibration batch,
runs the block on them, streams the inputs of one projection into statistics (stopping the forward
pass there), and can stand a pruned sub-module in by a replay of its output from stored inputs
(see ``docs/design.md``, "Fewer passes per block").
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from core.data.calibration import CalibrationBatch
from core.models.adapter import Adapter
from core.models.modeling_liar import set_module
from core.models.offload import Offload
from core.models.streaming import Stop as _Stop
from core.models.streaming import block_inputs


@dataclass(frozen=True, kw_only=True)
class KeptInputs:
    """Which of a projection's inputs :meth:`BlockRunner.collect` keeps. ``channels`` (an index
    tensor): only those channels of batches before ``full_from`` — all a replay needs — and whole
    inputs from ``full_from`` on (the held-aside batches, whose error report needs every channel);
    None keeps whole inputs throughout. Batches before ``keep_from`` are not kept (None in their
    place): a block that recomputes the module instead of replaying it keeps only what its error
    report reads."""

    channels: torch.Tensor | None = None
    full_from: int = 0
    keep_from: int = 0


class BlockRunner:
    """Runs blocks on stored inputs; ``hidden[i]`` / ``extra[i]`` are batch i's block inputs.

    Every per-batch activation it keeps (block inputs, replayed inputs and outputs, the dense model's
    states) goes through ``offload``: stored where the run keeps them (the device, or host memory)
    and fetched to the device where it is used (``core/models/offload.py``)."""

    def __init__(
        self,
        model: nn.Module,
        adapter: Adapter,
        batches: list[CalibrationBatch],
        device,
        positions: str = "all",
        offload: Offload | None = None,
    ):
        self.model, self.adapter, self.device = model, adapter, device
        self.offload = offload or Offload(device)
        self.masks = [b.token_mask(adapter.kind, device) for b in batches]
        if positions == "first":  # statistics of each sequence's first token only
            self.masks = [_first_only(m) for m in self.masks]
        self.positions = positions
        self.kept: dict[str, list[torch.Tensor]] = {}
        self.replays: dict[str, tuple[nn.Module, nn.Module]] = {}
        self.dense: list[torch.Tensor] | None = None  # the dense model's hidden states (error feedback)
        self.batch = 0
        inputs = (b.model_inputs(adapter.kind, device) for b in batches)  # one batch on the device at a time
        self.hidden, self.extra = block_inputs(model, adapter, inputs, keep=self.offload.store)
        # a block's position: its arguments may differ by layer (sliding-window vs full attention)
        self._index = {id(layer): li for li, layer in enumerate(adapter.layers(model))}

    def enter_last_block(self) -> None:
        """``positions: pooled``: from here on, statistics and errors of the first token only (the last
        block's other outputs are never read by a classifier pooling the first token)."""
        if self.positions == "pooled":
            self.masks = [_first_only(m) for m in self.masks]

    def run(self, layer: nn.Module, i: int) -> torch.Tensor:
        self.batch = i
        args, kwargs = self.extra[i][self._index[id(layer)]]
        out = layer(self.offload.fetch(self.hidden[i]), *args, **kwargs)
        return out[0] if isinstance(out, tuple) else out

    def collect(self, layer: nn.Module, path: str, sinks: list, keep: KeptInputs | None = None) -> None:
        """Stream the inputs of ``layer.<path>`` into ``sinks[i]`` (``add_batch(x, mask)``) for each batch
        i, then stop the block. With ``keep`` the inputs are also kept (model dtype, as ``keep`` says)
        so that :meth:`replay` can stand in for the module computing them instead of recomputing it.
        """
        current: list[int] = [0]
        kept: list[torch.Tensor | None] = []

        def hook(_mod, args):
            i = current[0]
            sinks[i].add_batch(args[0], self.masks[i])
            if keep is not None and i < keep.keep_from:
                kept.append(None)
            elif keep is not None:
                x = args[0].detach()
                x = x if keep.channels is None or i >= keep.full_from else select_channels(x, keep.channels)
                kept.append(self.offload.store(x))
            raise _Stop

        handle = layer.get_submodule(path).register_forward_pre_hook(hook)
        try:
            for i in range(len(self.hidden)):
                current[0] = i
                try:
                    self.run(layer, i)
                except _Stop:
                    pass
        finally:
            handle.remove()
        if keep is not None:
            self.kept[path] = kept

    def kept_rows(self, path: str, start: int) -> torch.Tensor:
        """The kept inputs of ``path`` for batches ``start:`` as one (n_tokens, C_in) matrix of real
        tokens (the same token mask the statistics use)."""
        return self.rows(self.kept[path][start:], start)

    def rows(self, tensors: list[torch.Tensor], start: int) -> torch.Tensor:
        """Per-batch inputs (batches ``start``, ``start + 1``, ...) as one matrix of real tokens."""
        rows = []
        for i, x in enumerate(tensors, start):
            x = self.offload.fetch(x).reshape(-1, x.shape[-1])
            mask = self.masks[i]
            rows.append(x if mask is None else x[mask.reshape(-1).to(x.device)])
        return torch.cat(rows)

    def track_dense(self) -> None:
        """Also carry the dense model's hidden states from block to block (error feedback); they are
        the same tensors as the pruned model's until a block is pruned."""
        self.dense = list(self.hidden)

    def dense_pass(self, layer: nn.Module, paths: list[str]) -> dict[str, list[torch.Tensor]]:
        """Run the block — still dense — on the dense model's hidden states: returns the inputs of
        ``paths`` per batch, and leaves the dense states entering the next block."""
        captured: dict[str, list[torch.Tensor]] = {p: [] for p in paths}
        handles = [
            layer.get_submodule(p).register_forward_pre_hook(
                lambda _m, a, p=p: captured[p].append(self.offload.store(a[0].detach()))
            )
            for p in paths
        ]
        try:
            for i in range(len(self.dense)):
                args, kwargs = self.extra[i][self._index[id(layer)]]
                out = layer(self.offload.fetch(self.dense[i]), *args, **kwargs)
                self.dense[i] = self.offload.store((out[0] if isinstance(out, tuple) else out).detach())
        finally:
            for h in handles:
                h.remove()
        return captured

    def replay(
        self,
        layer: nn.Module,
        block: str,
        path: str,
        keep: torch.Tensor,
        returns_tuple: bool,
        bypass: tuple[str | None, ...] = (),
    ) -> None:
        """Replace ``layer.<block>`` by a module replaying its (pruned) output from the kept inputs of
        ``path``: ``path(X[..., keep])`` if the projection lives inside the block, else ``X[..., keep]``.
        The modules in ``bypass`` become identities meanwhile: a norm whose output only that block
        reads (its output would be discarded), or an activation between the block and ``path``
        (OPT's inline FFN: the replayed values are already activated)."""
        inputs = self.kept[path]
        proj = layer.get_submodule(path) if path.startswith(block + ".") else None
        self.replays[block] = (layer.get_submodule(block), _Replay(inputs, keep, proj, returns_tuple, self))
        set_module(layer, block, self.replays[block][1])
        for name in filter(None, bypass):
            self.replays[name] = (layer.get_submodule(name), nn.Identity())
            set_module(layer, name, self.replays[name][1])

    def absorb(self, layer: nn.Module, block: str, at: str) -> torch.utils.hooks.RemovableHandle:
        """Fold the replayed output of ``layer.<block>`` into the stored block inputs as the block's
        next pass computes it: the input of ``layer.<at>`` (the FFN's input norm of a sequential
        pre-norm block: the residual stream after the attention) replaces batch i's block input, and
        the replay returns zeros for batch i from then on. The block's later passes compute the same
        values (``mid + 0`` is ``mid``), and one hidden-size activation per token is kept instead of
        two (the block input and the attention's output). Returns the hook's handle: remove it after
        that pass."""
        replay = self.replays[block][1]
        replay.absorbing = True

        def hook(_mod, args):
            i = self.batch
            y = replay.outputs.pop(i, None)
            if y is not None:
                replay.absorbed[i] = (y.shape, y.dtype)
                self.hidden[i] = self.offload.store(args[0].detach())

        return layer.get_submodule(at).register_forward_pre_hook(hook)

    def restore(self, layer: nn.Module) -> None:
        for block, (original, _) in self.replays.items():
            set_module(layer, block, original)
        self.replays.clear()
        self.kept.clear()

    def advance(self, layer: nn.Module) -> None:
        """Run the (pruned) block on every batch; each batch's inputs are replaced as soon as its
        outputs exist, so only one extra batch of hidden states is alive at a time."""
        for i in range(len(self.hidden)):
            self.hidden[i] = self.offload.store(self.run(layer, i).detach())


def select_channels(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    """``x[..., index]``, gathered on a 2-D view: on a CPU, ``index_select`` on the last dimension of
    a 3-D tensor runs ~8× slower than on the same data seen as (tokens, channels)."""
    out = x.reshape(-1, x.shape[-1]).index_select(1, index)
    return out.view(*x.shape[:-1], out.shape[-1])


def _first_only(mask: torch.Tensor) -> torch.Tensor:
    first = torch.zeros_like(mask)
    first[:, 0] = mask[:, 0]
    return first


class _Replay(nn.Module):
    """Stands in for a block whose output is a function of stored projection inputs.

    A batch's output is computed on its first use and kept in place of its stored inputs (which are
    released): later passes over the block (the FFN pass, then the output pass) reuse it instead of
    recomputing the projection, and the FFN's wide inputs do not outlive their last use.
    """

    def __init__(self, inputs, keep, proj, returns_tuple: bool, runner: BlockRunner):
        super().__init__()
        self.inputs, self.proj, self.returns_tuple, self.runner = inputs, proj, returns_tuple, [runner]
        self.keep = keep.nonzero().squeeze(1).to(runner.offload.device)  # where the inputs are fetched to
        self.absorbing = False  # outputs stay on the device until BlockRunner.absorb folds them in
        self.absorbed: dict[int, tuple[torch.Size, torch.dtype]] = {}  # batches folded in: output zero
        self.outputs: dict[int, torch.Tensor] = {}

    def forward(self, *args, **kwargs):
        runner = self.runner[0]
        i = runner.batch
        if i in self.absorbed:  # the block's input holds this output already
            shape, dtype = self.absorbed[i]
            zero = torch.zeros((), dtype=dtype, device=runner.offload.device).expand(shape)
            return (zero, None) if self.returns_tuple else zero
        y = self.outputs.get(i)
        if y is None:
            x = runner.offload.fetch(self.inputs[i])
            if x.shape[-1] != len(self.keep):  # stored whole (a held-aside batch): select the kept channels
                x = select_channels(x, self.keep)
            y = self.proj(x) if self.proj is not None else x
            self.outputs[i] = y if self.absorbing else runner.offload.store(y)
            self.inputs[i] = None  # the output stands for it from now on
        else:
            y = runner.offload.fetch(y)
        return (y, None) if self.returns_tuple else y
