"""Streamed execution: the model's blocks are read from its safetensors shards one at a time, pruned,
reconstructed, written to the output checkpoint and freed.

Device memory holds one block, the calibration hidden states entering it and one projection's
statistics; the embeddings only while the first block's inputs are computed (once per pass), the
final norm and head never. The output is a sharded
safetensors checkpoint — one shard for the parameters outside the blocks, one per block, and one of
zero biases when the stock config needs them — with each shard hashed while it is written. Shards are
written in background threads (:class:`ShardWriter`): hashing, writing and syncing block i's shard
overlap block i + 1's work, and host memory holds the blocks whose shards are in flight (one on a
CPU). Its config, tokenizer and recipe are written when the last block is done, so the checkpoint
loads (and can be evaluated) before :meth:`PruneResult.save` finishes it with the metrics, the model
card and ``SHA256SUMS``.

Criteria that need gradients of the whole model (SNIP, Taylor, Kwon et al.) cannot be computed one
block at a time; ``execution: auto`` runs them in memory and ``execution: stream`` refuses them. Depth
pruning streams (``core/pipeline/streamed_depth.py``): the removed span is never written, the blocks
after it are written under their new positions, and the shard count is the shorter model's.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.profiler import record_function

from core import criteria
from core.data.calibration import CalibrationBatch
from core.depth.replace import DepthError
from core.models.adapter import Adapter
from core.models.export import check_output_dir, write_config
from core.models.loading import ensure_pad_token
from core.models.offload import Offload
from core.models.safetensors_io import INDEX, LazyTensor, write_shard
from core.models.streaming import StreamedModel, host_io_threads
from core.pipeline.context import BlockIO, Progress
from core.pipeline.depth import depth_metrics
from core.pipeline.measure import BlockSpeed
from core.pipeline.result import PruneResult
from core.pipeline.runner import BlockRunner
from core.pipeline.scoring import BlockPass, score_by_blocks
from core.pipeline.streamed_depth import choose_span_streamed, drop_span
from core.spec.criteria import parse_options, streaming_refusal
from core.spec.recipe import Recipe


def check_streamable(recipe: Recipe) -> None:
    refusal = streaming_refusal(recipe.criterion.name)
    if refusal:
        raise ValueError(refusal)


def temporary_sibling(out: Path) -> Path:
    return out.parent / f".{out.name}.tmp-{os.getpid()}"


def shard_name(k: int, n: int) -> str:
    return f"model-{k:05d}-of-{n:05d}.safetensors"


def _write_when_ready(write, path: Path, tensors, ready: Callable[[], None] | None) -> str:
    if ready is not None:
        ready()
    return write(path, tensors)


class HostCopy:
    """A block's tensors on their way to host memory. From a GPU each is copied into pinned memory
    without the host waiting (in the device's stream order, so the device memory may be freed at
    once: whatever reuses it is ordered after the copy), and an event marks the end of the copies;
    :meth:`wait` blocks until they have landed — the shard writer's thread calls it before reading
    them. A tensor already on the host is taken as it is (a CPU run: the block's own tensors)."""

    def __init__(self, tensors: list[tuple[str, torch.Tensor]]):
        self.tensors: list[tuple[str, torch.Tensor]] = []
        self._event, device = None, None
        for name, t in tensors:
            if t.device.type == "cuda":
                device = t.device
                t = torch.empty(t.shape, dtype=t.dtype, pin_memory=True).copy_(t, non_blocking=True)
            self.tensors.append((name, t))
        if device is not None:  # after every copy above, on the stream they ran on (cuda:N's, not cuda:0's)
            self._event = torch.cuda.Event()
            self._event.record(torch.cuda.current_stream(device))

    def wait(self) -> None:
        if self._event is not None:
            self._event.synchronize()


class ShardWriter:
    """Writes shards into ``directory`` in background threads, at most ``in_flight`` at a time (each
    holds one block's tensors in host memory until written), recording which shard holds each tensor
    and each shard's sha256. Hashing (``hashlib``), file writes and ``fsync`` release the GIL, so
    shards are written while the caller goes on computing; with more than one in flight their hashing
    runs on as many cores. A failed write (a full disk) is raised by a later :meth:`submit` or by
    :meth:`wait`; :meth:`close` waits for the writes in flight before the caller removes the directory."""

    def __init__(self, directory: Path, in_flight: int = 1):
        if in_flight < 1:
            raise ValueError(f"in_flight must be at least 1, not {in_flight}")
        self.directory, self.in_flight = directory, in_flight
        self.weight_map: dict[str, str] = {}
        self.digests: dict[str, str] = {}
        self._threads = ThreadPoolExecutor(in_flight, thread_name_prefix="liar-write")
        self._pending: deque[tuple[str, Future]] = deque()

    def submit(
        self,
        file: str,
        tensors: list[tuple[str, torch.Tensor | LazyTensor]],
        ready: Callable[[], None] | None = None,
    ) -> None:
        """Write ``tensors`` (host tensors, or :class:`LazyTensor` read when written) as ``file`` once
        fewer than ``in_flight`` shards are being written; ``ready`` (a :class:`HostCopy`'s wait) is
        called by the writer thread before it reads them."""
        with record_function("liar.write_wait"):
            while len(self._pending) >= self.in_flight:
                self._finish_oldest()
        self.weight_map.update({name: file for name, _ in tensors})
        # ``write_shard`` looked up now: what the module holds at submission is what runs
        job = partial(_write_when_ready, write_shard, self.directory / file, tensors, ready)
        self._pending.append((file, self._threads.submit(job)))

    def rename(self, old: str, new: str) -> None:
        """Give the written shard ``old`` the name ``new`` (its tensors and digest follow), once the
        writes in flight are done."""
        self.wait()
        (self.directory / old).rename(self.directory / new)
        self.weight_map = {name: new if file == old else file for name, file in self.weight_map.items()}
        self.digests[new] = self.digests.pop(old)

    def _finish_oldest(self) -> None:
        file, future = self._pending.popleft()
        self.digests[file] = future.result()

    def wait(self) -> None:
        """Wait for every shard in flight; raise the first error of the ones that failed."""
        while self._pending:
            self._finish_oldest()

    def close(self) -> None:
        """Wait for the writes in flight (their errors dropped: the caller is giving up) and stop the threads."""
        for _, future in self._pending:
            future.exception()
        self._pending.clear()
        self._threads.shutdown(wait=True)


class StreamSource:
    """The streamed model with the checkpoint being written beside it."""

    def __init__(self, recipe: Recipe, directory: Path, output_dir: str | Path, overwrite: bool, tokenizer=None):
        self.out = check_output_dir(output_dir, overwrite)
        # asked to stream: memory first whatever the model's size; streamed by ``auto``: decided by its size
        bound = True if recipe.execution == "stream" else None
        self.sm = StreamedModel.open(directory, recipe.dtype, recipe.device, bound_memory=bound)
        self.model, self.adapter, self.device = self.sm.model, self.sm.adapter, self.sm.device
        self.tokenizer = tokenizer if tokenizer is not None else _tokenizer(directory, self.model.config)
        ensure_pad_token(self.tokenizer)
        _check_free_space(self.sm, recipe.ratio, self.out)
        self.tmp = temporary_sibling(self.out)
        if self.tmp.exists():
            shutil.rmtree(self.tmp)
        self.tmp.mkdir()
        self.n_shards = self.adapter.n_layers + 1
        self.writer = ShardWriter(self.tmp, host_io_threads(self.device))
        try:
            # copied one tensor at a time, and finished before the same tensors are loaded to run
            self.writer.submit(shard_name(1, self.n_shards), self.sm.outer_tensors())
            self.writer.wait()
            self.sm.load_outer(inputs_only=True)  # released once the block inputs are computed
        except BaseException:
            self.abort()
            raise

    def score(
        self, recipe: Recipe, batches: list[CalibrationBatch], progress: Callable[[int], None] | None, offload: Offload
    ) -> list:
        """Every layer's scores, each block read once (and run on the calibration data when the
        criterion needs its inputs); a weight criterion's pass reads only the parameters it scores.
        Block 0 is then read ahead for the pruning pass."""
        check_streamable(recipe)
        name = recipe.criterion.name
        criterion, opts = criteria.get(name), parse_options(name, recipe.criterion.options)
        runner = (
            BlockRunner(self.model, self.adapter, batches, self.device, offload=offload)
            if criterion.needs == "inputs"
            else None
        )
        # the embeddings are not needed again until the pruning pass computes its own block inputs: an
        # untied vocabulary's table (0.93 GB for a 151,936 × 1,536 one in float32) is not held meanwhile
        self.sm.release_outer()
        layers = self.sm.layers
        names = [scored_parameters(criterion, self.adapter, layer) for layer in layers]

        def load(i: int) -> None:
            self.sm.load_block(i, names[i])
            if not criterion.second_order and i + 1 < len(layers):  # no solves while scoring: read on
                self.sm.prefetch(i + 1, names[i + 1])

        blocks = BlockPass(offload=offload, load=load, free=self.sm.free_block, progress=progress)
        scores = score_by_blocks(recipe, self.adapter, layers, runner, blocks)
        self.sm.load_outer(inputs_only=True)  # for the pruning pass's block inputs (released after them)
        self.sm.prefetch(0)  # beside the plan and the calibration's pass through the embeddings
        return criterion.finalize(scores, opts)

    def remove_depth(
        self,
        recipe: Recipe,
        calibration: tuple[CalibrationBatch, CalibrationBatch],
        report: Progress,
        speed: BlockSpeed | None = None,
    ) -> dict[str, Any]:
        """Choose the span and take it out of the skeleton (``core/pipeline/streamed_depth.py``); the shard
        written first is renamed for the shorter model. A depth-only run then copies the kept blocks
        to their shards; otherwise the embeddings are brought back for the width pruning. Returns the
        run's depth metrics."""
        t0, n = time.perf_counter(), self.adapter.n_layers
        try:
            choice = choose_span_streamed(self.sm, recipe, calibration, report, speed)
        except DepthError as exc:
            raise ValueError(str(exc)) from None
        drop_span(self.sm, choice)
        self.adapter = self.sm.adapter
        old, self.n_shards = self.n_shards, self.adapter.n_layers + 1
        self.writer.rename(shard_name(1, old), shard_name(1, self.n_shards))
        self.sm.release_outer()
        if recipe.modules == "blocks":
            self._copy_blocks()
        else:
            self.sm.load_outer(inputs_only=True)
        return depth_metrics(choice, recipe, n, time.perf_counter() - t0)

    def _copy_blocks(self) -> None:
        """Write every block as it is in the checkpoint (read as its shard is written), but the one a
        stand-in folds into: that one is read, folded and written from the device."""
        for i in range(len(self.sm.layers)):
            if i in self.sm.edits:
                WriteBlocks(self).done(i, self.sm.load_block(i))
            else:
                self.writer.submit(shard_name(i + 2, self.n_shards), self.sm.block_tensors(i))

    @property
    def reuses_memory(self) -> bool:
        """Whether the run reuses freed host memory (the streamed model decided: see its ``bound_memory``)."""
        return not self.sm.bounds_memory

    @property
    def io(self) -> BlockIO:
        return WriteBlocks(self)

    def finish(self, result: PruneResult, report: Progress) -> PruneResult:
        """Write what follows the blocks (:meth:`write_rest`); the result then holds the checkpoint
        instead of the model."""
        report("write", 0, 1)
        layout = result.model.config.liar_layout
        result.model = None
        result.checkpoint, result.stock, result.digests = self.write_rest(result.recipe, layout)
        report("write", 1, 1)
        return result

    def write_rest(self, recipe: Recipe, layout: list[dict]) -> tuple[Path, bool, dict[str, str]]:
        """Write what follows the blocks: zero biases the stock config implies, the index, config,
        bundled code, tokenizer and recipe. Returns ``(directory, stock, digests)``."""
        self.sm.close()
        stock = write_config(self.model, self.adapter.name, layout, self.tmp)
        writer = self.writer
        missing = [(n, p) for n, p in self.model.named_parameters() if n not in writer.weight_map]
        if any(not n.endswith(".bias") for n, _ in missing):
            raise AssertionError(f"parameters not written: {[n for n, _ in missing]}")
        if missing:  # biases added by the stock form to projections that had none: zeros
            writer.submit(
                "model-zero-biases.safetensors", [(n, torch.zeros(p.shape, dtype=self.sm.dtype)) for n, p in missing]
            )
        writer.wait()
        writer.close()
        total = sum((self.tmp / f).stat().st_size for f in set(writer.weight_map.values()))
        index = {"metadata": {"total_size": total}, "weight_map": dict(sorted(writer.weight_map.items()))}
        (self.tmp / INDEX).write_text(json.dumps(index, indent=2) + "\n")
        if self.tokenizer is not None:
            self.tokenizer.save_pretrained(self.tmp)
        (self.tmp / "recipe.yaml").write_text(recipe.to_yaml())
        return self.tmp, stock, writer.digests

    def abort(self) -> None:
        self.sm.close()
        self.writer.close()  # no write may land in the directory after it is removed
        shutil.rmtree(self.tmp, ignore_errors=True)


def scored_parameters(criterion, adapter: Adapter, layer: nn.Module) -> frozenset[str] | None:
    """The parameters of a block (names within it) that a weight criterion reads (``reads``); None
    (all of them) for the others, which run the block or declare nothing."""
    if criterion.needs != "weights" or criterion.reads is None:
        return None
    paths = [getattr(adapter.family, attr) + "." for attr in criterion.reads]
    return frozenset(n for n, _ in layer.named_parameters() if n.startswith(tuple(paths)))


class WriteBlocks(BlockIO):
    def __init__(self, source: StreamSource):
        self.source = source

    def inputs_ready(self) -> None:
        self.source.sm.release_outer()  # the embeddings are not needed once the first block's inputs exist

    def load(self, index: int) -> None:
        self.source.sm.load_block(index)

    def solved(self, index: int) -> None:
        self.source.sm.prefetch(index + 1)  # after the block's peak, on the CPU (see StreamedModel)

    def done(self, index: int, layer: nn.Module) -> None:
        s = self.source
        prefix = s.sm.layer_prefix(index)
        # on their way to the host before the block is freed: a GPU queues the copies in stream order and
        # the device memory is released at once (the writer waits for them); on a CPU these are the
        # block's own tensors, kept alive until written
        with record_function("liar.to_host"):  # on a GPU the copies are queued, not waited for
            copy = HostCopy([(prefix + n, p.detach()) for n, p in layer.named_parameters()])
        s.sm.free_block(index)
        s.writer.submit(shard_name(index + 2, s.n_shards), copy.tensors, ready=copy.wait)

    def block_files(self, upto: int) -> tuple[dict[str, tuple[Path, str]], dict[str, Any]]:
        """The shards of blocks ``0 .. upto - 1`` once written (their sha256 computed as they were), and
        the tensors each holds."""
        s = self.source
        s.writer.wait()
        names = {shard_name(i + 2, s.n_shards) for i in range(upto)}
        files = {n: (s.tmp / n, s.writer.digests[n]) for n in names}
        return files, {"weight_map": {t: f for t, f in s.writer.weight_map.items() if f in names}}

    def restore_blocks(self, files: dict[str, Path], manifest: dict[str, Any]) -> None:
        """The checkpoint's shards into the output folder, as if this run had written them."""
        s = self.source
        for name, path in files.items():
            shutil.copyfile(path, s.tmp / name)
            s.writer.digests[name] = manifest["files"][name]
        s.writer.weight_map.update(manifest["weight_map"])


def _check_free_space(sm: StreamedModel, ratio: float, out: Path) -> None:
    """Refuse before writing anything when the output's disk cannot hold the pruned weights (their
    size estimated from the checkpoint: everything outside the blocks, and the blocks less ``ratio``)."""
    blocks = tuple(sm.source_name(sm.layer_prefix(i)) for i in range(len(sm.layers)))
    need = 0.0
    for name in sm.reader.entries:
        nbytes = sm.stored_bytes(name)
        need += nbytes * (1 - ratio) if name.startswith(blocks) else nbytes
    free = shutil.disk_usage(out.parent).free
    if free < need:
        raise InsufficientDiskSpace(
            f"not enough disk space to write the checkpoint to {out}: the pruned weights need about "
            f"{need / 1e9:.2f} GB and {free / 1e9:.2f} GB are free"
        )


class InsufficientDiskSpace(OSError):
    """The output's disk is too small for the pruned checkpoint (found before writing)."""


def _tokenizer(directory: Path, config):
    from transformers import AutoTokenizer

    try:
        return AutoTokenizer.from_pretrained(directory, config=config)
    except Exception as exc:
        raise RuntimeError(f"could not load a tokenizer from {str(directory)!r}: {exc}") from exc
