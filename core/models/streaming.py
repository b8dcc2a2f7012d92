"""A model whose blocks live on disk: the skeleton without weights, one block materialised at a time.

:class:`StreamedModel` builds the Hugging Face model with every *parameter* on the meta device (no
memory) while buffers are real (rotary frequencies, position ids), loads the parameters outside the
blocks (embeddings, final norm, head) onto the device, and materialises one block at a time from
the checkpoint's safetensors shards (:class:`core.models.safetensors_io.CheckpointReader`) — for
pruning, scoring or evaluation — and frees it again.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from functools import partial
from pathlib import Path

import torch
from torch import nn
from torch.profiler import record_function

from core.models.adapter import Adapter, adapter_for
from core.models.config_file import read_config
from core.models.host_memory import available_memory, bounds_memory, keep_freed_memory, release_freed_memory
from core.models.loading import is_pruned_config, model_class, pruned_classes, resolve_device, resolve_dtype
from core.models.safetensors_io import CheckpointError, CheckpointReader, LazyTensor, place

META = torch.device("meta")


@contextmanager
def params_on_meta() -> Iterator[None]:
    """Build modules with their parameters on the meta device and their buffers where they are made:
    a parameter is moved to meta as it is registered, so an initialiser that runs afterwards touches
    no memory."""
    original = nn.Module.register_parameter

    def register(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        original(module, name, param)
        if param is not None and param.device.type != "meta":
            module._parameters[name] = nn.Parameter(param.to(META), requires_grad=param.requires_grad)

    nn.Module.register_parameter = register
    try:
        yield
    finally:
        nn.Module.register_parameter = original


def _skeleton(directory: Path, dtype: torch.dtype):
    from transformers import AutoConfig

    raw = read_config(directory)
    if is_pruned_config(raw):
        config_cls, cls = pruned_classes(raw, directory / "config.json")
        config = config_cls.from_pretrained(directory)
    else:
        config = AutoConfig.from_pretrained(directory)
        cls = model_class(config, adapter_for(config).kind)
    with params_on_meta():
        model = cls.from_config(config, dtype=dtype) if hasattr(cls, "from_config") else cls._from_config(config)
    return model.eval()


def host_io_threads(device: torch.device) -> int:
    """Host threads for a streamed run's file work (a block's tensor reads, its shards' writes): one on
    a CPU, whose cores run the pruning (and whose run is sized to hold one block more at most); on a
    GPU worker the host's cores are free, and one per two cores up to 4 keeps reads (a few GB/s per
    thread) and sha256 (≈ 1.4 GB/s per core) from falling behind the device."""
    if torch.device(device).type == "cpu":
        return 1
    return max(1, min(4, (os.cpu_count() or 2) // 2))


class StreamedModel:
    """A checkpoint directory seen as a model whose blocks are materialised one at a time.

    With ``prefetch`` (the default), block i + 1's tensors are read from disk into host memory in a
    background thread (file reads release the GIL) while block i is computed; the cost is one more
    block in host memory. On a GPU the read starts when block i is loaded (host memory is not where the
    solves run). On the CPU it starts only when the caller says block i's solves are done
    (:meth:`prefetch`): there the prefetched block would sit beside the FFN's float64 covariance,
    factor and inverse — the run's peak — and the read still overlaps the pruned block's forward
    passes and the writing of its shard.

    A block's tensors are read by ``read_threads`` threads at once (default :func:`host_io_threads`:
    one on a CPU, up to 4 on a GPU worker): a read from the page cache or an NVMe drive runs at a few
    GB/s per thread, and a pass that only reads (a weight criterion's scoring pass) waits on it.

    ``bound_memory``: whether host memory is bounded (every allocation mapped and given back when
    freed) or freed memory is reused; None decides by the weights' size against the memory available
    (:func:`core.models.host_memory.bounds_memory`). The choice is :attr:`bounds_memory`.
    """

    def __init__(
        self,
        directory: str | Path,
        dtype: torch.dtype,
        device: torch.device,
        prefetch: bool = True,
        read_threads: int | None = None,
        bound_memory: bool | None = None,
    ):
        self.directory, self.dtype, self.device = Path(directory), dtype, torch.device(device)
        self._reads = ThreadPoolExecutor(1, thread_name_prefix="liar-prefetch") if prefetch else None
        threads = host_io_threads(self.device) if read_threads is None else read_threads
        self._tensor_reads = ThreadPoolExecutor(threads, thread_name_prefix="liar-read") if threads > 1 else None
        self._pending: dict[int, tuple[frozenset[str] | None, Future]] = {}  # block: (names, read)
        self.prefetch_at_load = self.device.type != "cpu"
        self.reader = CheckpointReader(self.directory)  # checks every shard first (reads only headers)
        if bound_memory is None:
            weights = sum(self.stored_bytes(name) for name in self.reader.entries)
            bound_memory = bounds_memory(weights, self.device, available_memory())
        self.bounds_memory = bound_memory
        if bound_memory:  # before any weight is read: see core/models/host_memory.py
            release_freed_memory()
        else:
            keep_freed_memory()
        self.model = _skeleton(self.directory, dtype)
        self.adapter: Adapter = adapter_for(self.model)
        self.layers = self.adapter.layers(self.model)
        self._prefix = self._checkpoint_prefix()
        block_ids = {id(p) for layer in self.layers for p in layer.parameters()}
        self._outer = [
            (name, p) for name, p in self.model.named_parameters(remove_duplicate=False) if id(p) not in block_ids
        ]
        self._outer_names = {name for name, _ in self._outer}
        module_names = {id(m): name for name, m in self.model.named_modules()}
        self._layer_prefixes = [module_names[id(layer)] + "." for layer in self.layers]
        self._read_prefixes = list(self._layer_prefixes)  # where each block's tensors are in the checkpoint
        # block index: applied to the block each time it is materialised (a depth stand-in folded in)
        self.edits: dict[int, Callable[[nn.Module], None]] = {}

    @classmethod
    def open(
        cls,
        directory: str | Path,
        dtype: str = "auto",
        device: str = "auto",
        prefetch: bool = True,
        bound_memory: bool | None = None,
    ) -> StreamedModel:
        """Open a checkpoint with a recipe's ``dtype`` / ``device`` names (``auto`` resolved as
        :func:`core.models.loading.load_model` does)."""
        dev = resolve_device(device)
        dt = resolve_dtype(dtype, read_config(directory), dev)
        return cls(directory, dt, dev, prefetch, bound_memory=bound_memory)

    def stored_bytes(self, name: str) -> int:
        """Bytes of checkpoint tensor ``name`` once read (floating tensors in the run's dtype)."""
        e = self.reader.entries[name]
        return e.nbytes // e.dtype.itemsize * (self.dtype if e.dtype.is_floating_point else e.dtype).itemsize

    # names -------------------------------------------------------------------------------------
    def _checkpoint_prefix(self) -> tuple[str, str]:
        """``(strip, add)`` turning a model parameter name into the checkpoint's name: checkpoints of a
        base model lack the task model's ``<base_model_prefix>.`` (and the other way round)."""
        prefix = getattr(self.model, "base_model_prefix", "") + "."
        names = [n for n, _ in self.model.named_parameters()]
        if any(n in self.reader for n in names):
            return "", ""
        if any(n.startswith(prefix) and n[len(prefix) :] in self.reader for n in names):
            return prefix, ""
        if any(prefix + n in self.reader for n in names):
            return "", prefix
        raise CheckpointError(
            f"the tensors in {str(self.directory)!r} do not match a {type(self.model).__name__} "
            f"(e.g. {names[0]!r} is not among them)"
        )

    def source_name(self, name: str) -> str:
        strip, add = self._prefix
        return add + (name[len(strip) :] if strip and name.startswith(strip) else name)

    def layer_prefix(self, i: int) -> str:
        """The layer's parameter-name prefix in the model (``model.layers.3.``)."""
        return self._layer_prefixes[i]

    def keep_blocks(self, kept: list[int]) -> None:
        """The skeleton now holds only blocks ``kept`` of the checkpoint's (in order: depth pruning put
        them in its layer list): block i is read from the checkpoint's block ``kept[i]`` and named by its
        new position. Reads under way are dropped, and so are the edits (their indices changed)."""
        for _, future in self._pending.values():  # a read in progress finishes; its result is dropped
            future.cancel()
        self._pending.clear()
        self.edits.clear()
        self.adapter = adapter_for(self.model)
        self.layers = self.adapter.layers(self.model)
        module_names = {id(m): name for name, m in self.model.named_modules()}
        self._layer_prefixes = [module_names[id(layer)] + "." for layer in self.layers]
        self._read_prefixes = [self._read_prefixes[k] for k in kept]

    # loading -----------------------------------------------------------------------------------
    def _source(self, name: str) -> tuple[str, torch.dtype | None]:
        """The checkpoint name of model parameter ``name`` and the dtype it is read in (the run's
        for floating tensors, None: as stored)."""
        source = self.source_name(name)
        if source not in self.reader:
            raise CheckpointError(f"{str(self.directory)!r} has no tensor {source!r}")
        return source, self.dtype if self.reader.entries[source].dtype.is_floating_point else None

    def _read(self, name: str) -> torch.Tensor:
        source, dtype = self._source(name)
        return self.reader.read(source, self.device, dtype)

    def _after_blocks(self) -> set[str]:
        """Names of the parameters applied after the last block (final norm, output head)."""
        tails = [self.model.get_output_embeddings()]
        if self.adapter.family.final_norm:
            tails.append(self.model.base_model.get_submodule(self.adapter.family.final_norm))
        ids = {id(p) for m in tails if m is not None for p in m.parameters()}
        ids -= {id(p) for p in self.model.get_input_embeddings().parameters()}  # a head tied to them
        return {name for name, p in self._outer if id(p) in ids}

    def load_outer(self, inputs_only: bool = False) -> None:
        """Materialise everything outside the blocks on the device (tied parameters stay tied);
        ``inputs_only``: only what runs before the first block (not the final norm and head)."""
        groups: dict[int, list[str]] = {}
        for name, p in self._outer:
            groups.setdefault(id(p), []).append(name)
        skip = self._after_blocks() if inputs_only else set()
        for names in groups.values():
            if all(n in skip for n in names):
                continue
            present = [n for n in names if self.source_name(n) in self.reader]
            if not present:
                raise CheckpointError(f"{str(self.directory)!r} has no tensor {self.source_name(names[0])!r}")
            param = nn.Parameter(self._read(present[0]), requires_grad=False)
            for n in names:
                _set_param(self.model, n, param)
        for module in self.model.modules():  # buffers were built on the host
            for key, buf in module._buffers.items():
                if buf is not None and buf.device != self.device:
                    module._buffers[key] = buf.to(self.device)

    def load_block(self, i: int, names: frozenset[str] | None = None) -> nn.Module:
        """Materialise block i on the device (from its prefetched tensors when block i - 1 started
        reading them); on a GPU, start reading block i + 1. ``names``: only these of the block's
        parameters (names within the block), the others stay on the meta device — what a weight
        criterion's scoring pass reads."""
        layer, prefix = self.layers[i], self._read_prefixes[i]
        pending = self._pending.pop(i, None)
        with record_function("liar.read_block"):  # a prefetched block: the wait for its read
            if pending is not None and pending[0] == names:
                host = pending[1].result()
            else:  # not prefetched, or another part of it (that read's result is dropped)
                host = self._read_block(i, names)
        with record_function("liar.to_device"):
            for name, tensor in host.items():
                _, dtype = self._source(prefix + name)
                _set_param(layer, name, nn.Parameter(place(tensor, self.device, dtype), requires_grad=False))
        del host
        if i in self.edits:
            self.edits[i](layer)
        if self.prefetch_at_load:
            self.prefetch(i + 1, names)
        return layer

    def _read_block(self, i: int, names: frozenset[str] | None = None) -> dict[str, torch.Tensor]:
        """Block i's parameters (``names`` of them, or all) as stored, in host memory (pinned for a
        GPU); with several read threads, the largest tensors are started first."""
        prefix, pinned = self._read_prefixes[i], self.device.type == "cuda"
        sources = {
            name: self._source(prefix + name)[0]
            for name, _ in self.layers[i].named_parameters()
            if names is None or name in names
        }
        if self._tensor_reads is None:
            return {name: self.reader.read_host(source, pinned) for name, source in sources.items()}
        order = sorted(sources, key=lambda n: -self.reader.entries[sources[n]].nbytes)
        reads = {name: self._tensor_reads.submit(self.reader.read_host, sources[name], pinned) for name in order}
        return {name: reads[name].result() for name in sources}

    def prefetch(self, i: int, names: frozenset[str] | None = None) -> None:
        """Start reading block i (``names`` of its parameters, or all) in the background (nothing when
        prefetching is off, i is past the last block, or its read is already under way)."""
        if self._reads is not None and 0 <= i < len(self.layers) and i not in self._pending:
            self._pending[i] = (names, self._reads.submit(self._read_block, i, names))

    def close(self) -> None:
        """Stop the background reads (a read in progress finishes; its result is dropped)."""
        for _, future in self._pending.values():
            future.cancel()
        self._pending.clear()
        if self._reads is not None:
            self._reads.shutdown(wait=True)
            self._reads = None
        if self._tensor_reads is not None:
            self._tensor_reads.shutdown(wait=True)
            self._tensor_reads = None

    def free_block(self, i: int) -> None:
        """Put block i's parameters back on the meta device (its memory is released)."""
        layer = self.layers[i]
        for name, p in list(layer.named_parameters()):
            _set_param(layer, name, nn.Parameter(p.detach().to(META), requires_grad=False))

    def release_outer(self) -> None:
        """Put the parameters outside the blocks back on the meta device."""
        groups: dict[int, tuple[nn.Parameter, list[str]]] = {}
        for name, p in self.model.named_parameters(remove_duplicate=False):
            if name in self._outer_names and not p.is_meta:
                groups.setdefault(id(p), (p, []))[1].append(name)
        for p, names in groups.values():  # tied parameters stay tied
            meta = nn.Parameter(p.detach().to(META), requires_grad=False)
            for name in names:
                _set_param(self.model, name, meta)

    def block_tensors(self, i: int) -> list[tuple[str, LazyTensor]]:
        """Block i's parameters as ``(name in the model, tensor read on demand)`` in the run's dtype —
        for copying a block as it is to an output shard (its edits are not applied)."""
        return [
            (self.layer_prefix(i) + name, self._lazy(self._read_prefixes[i] + name, tuple(p.shape)))
            for name, p in self.layers[i].named_parameters()
        ]

    def _lazy(self, name: str, shape: tuple[int, ...]) -> LazyTensor:
        source, dtype = self._source(name)
        read = partial(self.reader.read, source, dtype=dtype)
        return LazyTensor(shape, dtype or self.reader.entries[source].dtype, read)

    def outer_tensors(self) -> list[tuple[str, LazyTensor]]:
        """The parameters outside the blocks as ``(name, tensor read on demand)`` in the run's dtype,
        each tied group once — for copying them to an output shard one tensor at a time."""
        out = []
        for name, p in self.model.named_parameters():  # tied parameters once, under the first name
            if name in self._outer_names:
                out.append((name, self._lazy(name, tuple(p.shape))))
        return out


class Stop(Exception):
    """Raised from a hook to skip the rest of a forward pass."""


def head_logits(model: nn.Module, adapter: Adapter) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hidden states after the last block → logits: the final norm, the head, and the soft cap of the
    families that have one (Gemma 2)."""
    norm, head = model.base_model.get_submodule(adapter.family.final_norm), model.get_output_embeddings()
    cap = getattr(model.config, "final_logit_softcapping", None)

    def logits(h: torch.Tensor) -> torch.Tensor:
        out = head(norm(h))
        return out if not cap else torch.tanh(out / cap) * cap

    return logits


def block_inputs(
    model: nn.Module,
    adapter: Adapter,
    inputs: Iterable[dict],
    keep: Callable[[torch.Tensor], torch.Tensor] | None = None,
) -> tuple[list[torch.Tensor], list]:
    """The hidden states entering the first block, and the other arguments each block receives
    (attention mask, position embeddings, ...), for each batch of base-model keyword ``inputs``:
    ``extra[batch][layer] = (args, kwargs)`` — per layer, since sliding-window and full-attention
    layers (Gemma, Qwen) get different masks and rotary embeddings. Only the embeddings run: every
    block is stood in for by a recorder passing its input through (the last one stops the pass).
    ``keep`` stores each batch's hidden states as they are computed (to host memory, say)."""
    layers = adapter.layers(model)
    hidden: list[torch.Tensor] = []
    extra: list[list[tuple[tuple, dict]]] = []

    def recorder(li: int):
        def forward(*args, **kwargs):
            kwargs = dict(kwargs)
            h = args[0] if args else kwargs.pop("hidden_states")
            if li == 0:
                hidden.append(h.detach() if keep is None else keep(h.detach()))
                extra.append([])
            extra[-1].append((tuple(args[1:]), kwargs))
            if li == len(layers) - 1:
                raise Stop
            return h

        return forward

    for li, layer in enumerate(layers):
        layer.forward = recorder(li)  # an instance attribute: shadows the class's forward
    try:
        for batch in inputs:
            try:
                model.base_model(**batch)
            except Stop:
                pass
    finally:
        for layer in layers:
            del layer.forward
    return hidden, extra


def _set_param(root: nn.Module, name: str, param: nn.Parameter) -> None:
    owner, _, leaf = name.rpartition(".")
    module = root.get_submodule(owner) if owner else root
    module._parameters[leaf] = param


def checkpoint_directory(name: str) -> Path | None:
    """The local directory a model name refers to, or the hub snapshot holding it (downloaded
    without loading it when needed); None when it cannot be had as safetensors files."""
    local = Path(name).expanduser()
    if local.is_dir():
        return local
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(name, allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.py"])
    except Exception:
        return None
    return Path(path)
