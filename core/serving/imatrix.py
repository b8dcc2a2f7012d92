"""An importance matrix for llama.cpp's quantizer, from the pruned model's own activations.

llama.cpp's K- and i-quants choose each block's scales to minimise the squared error of the weights
weighted per input channel by ``E[x_j²]``, the mean squared input that channel carries on real text
(``llama-imatrix`` measures it; without one every channel counts the same). The statistics are the
diagonal of the Gram matrices the reconstruction already works with, taken here for every matrix the
GGUF file holds (q/k/v, the attention output, gate/up/down and the output head) in one forward pass of
the pruned checkpoint over its recipe's calibration windows, or over any text.

The file is llama.cpp's own GGUF form of it, as ``llama-imatrix`` writes it: per tensor
``<name>.in_sum2`` (the sum of squared inputs per channel, float32) and ``<name>.counts`` (the tokens
summed), with ``general.type = imatrix``, ``imatrix.datasets``, ``imatrix.chunk_count`` and
``imatrix.chunk_size``; ``llama-quantize --imatrix FILE`` reads it as it is. The channels are in the
GGUF tensor's column order: they go through the same conversion as the weights
(``core.serving.quantize.to_gguf_names``), the attention output's columns regrouped by head with them.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from torch import nn

from core.serving.layout import ExportError

SUFFIX_SUMS, SUFFIX_COUNTS = ".in_sum2", ".counts"
NEEDS_IMATRIX = frozenset({"iq3_xxs", "iq2_m"})  # llama.cpp refuses to write these without one
IMATRIX_HINT = (
    "pass --imatrix auto (gathered from the checkpoint's calibration text in one forward pass), "
    "--imatrix-text FILE, or a file llama-imatrix wrote"
)


@dataclass
class Imatrix:
    """Per GGUF tensor name: the sum of squared inputs per column (float64) and the token count."""

    sums: dict[str, np.ndarray]
    counts: dict[str, int]
    datasets: list[str]
    chunk_size: int = 0
    chunk_count: int = 0

    def means(self) -> dict[str, np.ndarray]:
        """``E[x_j²]`` per tensor, the weights llama.cpp's quantizer takes (a channel never seen: 1)."""
        return {
            n: (s / self.counts[n] if self.counts[n] > 0 else np.ones_like(s)).astype(np.float32)
            for n, s in self.sums.items()
        }


def input_sums(model: nn.Module, batches: Iterable[torch.Tensor]) -> tuple[dict[str, torch.Tensor], int]:
    """Sum of squared inputs per input channel of every ``nn.Linear`` in ``model`` (float64, keyed by
    the weight's name) over the token windows ``batches`` (``(b, L)`` ids, every position a real token),
    and the number of tokens."""
    sums: dict[str, torch.Tensor] = {}

    def hook(name: str):
        def record(_module, args, _out):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).to(torch.float64)
            total = x.square().sum(0)
            sums[name] = total if name not in sums else sums[name] + total

        return record

    handles = [
        m.register_forward_hook(hook(f"{n}.weight")) for n, m in model.named_modules() if isinstance(m, nn.Linear)
    ]
    tokens = 0
    try:
        with torch.inference_mode():
            for ids in batches:
                model(input_ids=ids, use_cache=False)
                tokens += ids.numel()
    finally:
        for h in handles:
            h.remove()
    return sums, tokens


class StatsReader:
    """A checkpoint reader whose linear weights read as their input statistics broadcast over their rows
    (every other tensor as zeros of its shape): fed through the GGUF conversion, each matrix's first
    row comes out as its statistics in the GGUF tensor's column order."""

    def __init__(self, reader, sums: dict[str, torch.Tensor]):
        self.reader, self.sums, self.entries = reader, sums, reader.entries

    def __contains__(self, name: str) -> bool:
        return name in self.reader

    def read(self, name: str, dtype=torch.float32) -> torch.Tensor:
        shape = tuple(self.entries[name].shape)
        if name in self.sums and len(shape) == 2:
            s = self.sums[name].to(dtype)
            if s.shape[0] != shape[1]:
                raise ExportError(f"{name}: statistics of {s.shape[0]} channels for a matrix of {shape[1]} columns")
            return s.expand(shape[0], -1)
        return torch.zeros((), dtype=dtype).expand(shape)


def write(path: str | Path, imatrix: Imatrix) -> Path:
    """``imatrix`` as llama.cpp's GGUF importance-matrix file at ``path`` (written beside it, then
    renamed into place)."""
    import os

    import gguf

    path = Path(path).expanduser()
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    writer = gguf.GGUFWriter(tmp, "llama")
    try:
        writer.kv_data[0].pop("general.architecture", None)  # llama-imatrix states a type, not a model
        writer.add_string("general.type", "imatrix")
        writer.add_array("imatrix.datasets", list(imatrix.datasets))
        writer.add_uint32("imatrix.chunk_count", int(imatrix.chunk_count))
        writer.add_uint32("imatrix.chunk_size", int(imatrix.chunk_size))
        for name in sorted(imatrix.sums):
            writer.add_tensor(name + SUFFIX_SUMS, imatrix.sums[name].astype(np.float32).reshape(1, -1))
            writer.add_tensor(name + SUFFIX_COUNTS, np.array([[imatrix.counts[name]]], dtype=np.float32))
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
        writer.close()
        os.replace(tmp, path)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    return path


def read(path: str | Path) -> Imatrix:
    """An importance-matrix file (GGUF form) back; ``ExportError`` if it is not one."""
    import gguf

    try:
        r = gguf.GGUFReader(Path(path).expanduser())
    except (OSError, ValueError) as exc:
        raise ExportError(f"{path} is not a GGUF importance matrix ({exc})") from None
    field = r.fields.get("general.type")
    if field is None or field.contents() != "imatrix":
        raise ExportError(f"{path} is a GGUF file but not an importance matrix (general.type is not 'imatrix')")
    data = {t.name: np.asarray(t.data, dtype=np.float64).reshape(-1) for t in r.tensors}
    sums = {n[: -len(SUFFIX_SUMS)]: v for n, v in data.items() if n.endswith(SUFFIX_SUMS)}
    counts = {n: int(round(float(data[n + SUFFIX_COUNTS][0]))) for n in sums if n + SUFFIX_COUNTS in data}
    if set(counts) != set(sums):
        raise ExportError(f"{path}: a tensor's sums come without its counts")

    def value(key: str, default):
        f = r.fields.get(key)
        return f.contents() if f is not None else default

    return Imatrix(
        sums,
        counts,
        list(value("imatrix.datasets", [])),
        int(value("imatrix.chunk_size", 0)),
        int(value("imatrix.chunk_count", 0)),
    )


def check_fits(made: Imatrix, columns: dict[str, int], name: str) -> None:
    """``ExportError`` unless every matrix the importance matrix ``made`` (from the file ``name``) names is
    one of ``columns`` (GGUF tensor → columns) with as many columns."""
    for tensor, sums in made.sums.items():
        if tensor not in columns:
            raise ExportError(f"the importance matrix {name} names {tensor}, which this checkpoint does not have")
        if len(sums) != columns[tensor]:
            raise ExportError(
                f"the importance matrix {name} was made for another model: {tensor} has {len(sums)} "
                f"channels there and {columns[tensor]} here"
            )
