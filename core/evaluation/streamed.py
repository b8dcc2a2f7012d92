"""Forward passes of a checkpoint bigger than the device, one block at a time (for evaluation).

Every batch passes through block ℓ before block ℓ+1 is read from the checkpoint: on the device are
only the embeddings, the final norm and head, one block, and the batches' hidden states — or, when
those would not fit (``activations: auto``) or when asked (``host``), the hidden states wait in host
memory between blocks (``core/models/offload.py``). Perplexity (``core.evaluation.perplexity``) and
lm-eval's log-likelihoods (``core.evaluation.lmeval_streamed``) are computed from the last block's
outputs with :func:`output_logits`, at the positions they read.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import torch
from tqdm.auto import tqdm

from core.models.offload import Offload, block_working_bytes, choose_offload
from core.models.streaming import StreamedModel, block_inputs, head_logits


def open_decoder(directory: str | Path, dtype: str = "auto", device: str = "auto", what: str = "perplexity"):
    """The checkpoint as a :class:`StreamedModel` with its outer weights on the device; refuses a model
    that is not a causal language model (``what`` names what needs one)."""
    sm = StreamedModel.open(directory, dtype, device)
    if sm.adapter.kind != "decoder" or sm.adapter.family.final_norm is None:
        sm.close()
        raise ValueError(f"{what} needs a causal language model")
    sm.load_outer()
    return sm


@torch.no_grad()
def final_states(
    sm: StreamedModel,
    batches: list[torch.Tensor],
    activations: str = "auto",
    show_progress: bool = False,
    desc: str = "forward",
) -> tuple[list[torch.Tensor], Offload]:
    """The last block's outputs for each batch of token ids (``(batch, length)`` on the device; no
    attention mask: causal models with right padding, whose padded positions nothing reads), kept
    where :class:`Offload` puts them — read them with ``offload.fetch``. Reads every block once."""
    itemsize = sm.dtype.itemsize
    needed = sum(b.numel() for b in batches) * sm.adapter.hidden * itemsize
    # the first block is on the meta device: its size, not its values
    batch_tokens = max(b.numel() for b in batches)
    working = block_working_bytes(sm.layers[0], sm.adapter, batch_tokens, itemsize, matrices=0)
    offload = choose_offload(activations, sm.device, needed, working)
    inputs = ({"input_ids": b, "use_cache": False} for b in batches)
    hidden, extra = block_inputs(sm.model, sm.adapter, inputs, keep=offload.store)
    for li in tqdm(range(len(sm.layers)), desc=desc, unit="layer", disable=not show_progress):
        layer = sm.load_block(li)
        for i, per_layer in enumerate(extra):
            args, kwargs = per_layer[li]
            out = layer(offload.fetch(hidden[i]), *args, **kwargs)
            hidden[i] = offload.store(out[0] if isinstance(out, tuple) else out)
        sm.free_block(li)
    return hidden, offload


def output_logits(sm: StreamedModel) -> Callable[[torch.Tensor], torch.Tensor]:
    """Hidden states after the last block → logits (:func:`head_logits` of the streamed model)."""
    return head_logits(sm.model, sm.adapter)


def available_host_bytes() -> int:
    """Memory the host can still give without swapping (``MemAvailable``; free pages where unknown)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    import os

    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
