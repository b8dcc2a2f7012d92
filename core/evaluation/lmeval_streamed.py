"""lm-eval tasks on a checkpoint bigger than the device, read one block at a time.

The harness asks a model for log-likelihoods request by request, batch by batch; run that way, a
model that does not fit the device would be read from disk once per batch. Here every request of a
task set is gathered first and the whole set goes through the model block by block, as the streamed
perplexity does (``core.evaluation.streamed``): the checkpoint is read once per *pass*, and a pass
holds as many requests as their hidden states fit in (half the host's available memory by default;
on a GPU they stay on the device when they fit there, else they wait in host memory between blocks).

Tokenisation, truncation to the model's context, the empty-context prefix token and the rolling
windows of ``loglikelihood_rolling`` are the harness's own (the class extends its ``HFLM``), so
scores equal an in-memory ``HFLM`` run up to float rounding (log-softmax in float32 here). Requests
whose model input is the same token sequence (the choices of a multiple-choice question that differ
in one last token) share one row, as the harness's logits cache does. Tasks that generate text
(``generate_until``) need a token-by-token loop over the whole model and are refused before
anything is read.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from lm_eval.models.huggingface import HFLM

from core.evaluation.lmeval import run_harness
from core.evaluation.streamed import available_host_bytes, final_states, open_decoder, output_logits
from core.evaluation.tasks import TaskSelection, load_tasks, select_tasks
from core.models.loading import ensure_pad_token
from core.models.streaming import StreamedModel

Request = tuple[Any, list[int], list[int]]  # ((context, continuation) or None, context ids, continuation ids)


class StreamedLM(HFLM):
    """The harness's ``HFLM`` over a :class:`StreamedModel`: log-likelihoods computed for all requests
    at once, block by block. ``passes`` counts the reads of the whole model so far."""

    def __init__(
        self,
        sm: StreamedModel,
        tokenizer,
        batch_size: int = 8,
        activations: str = "auto",
        pass_bytes: int | None = None,
        show_progress: bool = False,
    ):
        super().__init__(pretrained=sm.model, tokenizer=tokenizer, backend="causal", batch_size=batch_size)
        self._device = sm.device  # the skeleton's parameters are on the meta device
        self.sm, self.activations, self.show_progress = sm, activations, show_progress
        budget = available_host_bytes() // 2 if pass_bytes is None else pass_bytes
        self.pass_tokens = max(1, budget // (sm.adapter.hidden * sm.dtype.itemsize))
        self.passes = 0
        self._logits = output_logits(sm)

    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        raise ValueError(
            "generation tasks (generate_until) need the whole model in memory: a streamed evaluation "
            "computes log-likelihoods only"
        )

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        """The harness's rolling windows of every request, scored in one go (not one pass per batch)."""
        from lm_eval import utils

        windows: list[Request] = []
        owner: list[int] = []
        for i, (string,) in enumerate(req.args for req in requests):
            rolling = utils.get_rolling_token_windows(
                token_list=self.tok_encode(string),
                prefix_token=self.prefix_token_id,
                max_seq_len=self.max_length,
                context_len=1,
            )
            for context, continuation in map(utils.make_disjoint_window, rolling):
                windows.append((None, context, continuation))
                owner.append(i)
        totals = [0.0] * len(requests)
        for i, (logprob, _) in zip(owner, self._loglikelihood_tokens(windows), strict=True):
            totals[i] += logprob
        for req, total in zip(requests, totals, strict=True):
            self.cache_hook.add_partial("loglikelihood_rolling", req.args, total)
        return totals

    def _loglikelihood_tokens(
        self, requests: list[Request], disable_tqdm: bool = False, override_bs: int | None = None
    ) -> list[tuple[float, bool]]:
        """``(sum of log p(continuation), whether it is the greedy continuation)`` per request."""
        rows: dict[tuple[int, ...], int] = {}  # model input → row
        users: dict[int, list[int]] = defaultdict(list)  # row → requests reading it
        for r, (_, context, continuation) in enumerate(requests):
            if not context or not continuation:
                raise ValueError("a log-likelihood request needs a context and a continuation")
            # the harness's truncation: the last max_length + 1 tokens, the final one only predicted
            ids = tuple((context + continuation)[-(self.max_length + 1) :][:-1])
            users[rows.setdefault(ids, len(rows))].append(r)
        sequences = sorted(rows, key=len, reverse=True)  # longest first: batches of similar lengths
        batches = [sequences[i : i + self.batch_size] for i in range(0, len(sequences), self.batch_size)]
        results: list[tuple[float, bool] | None] = [None] * len(requests)
        for group in self._passes(batches):
            self.passes += 1
            padded = [_pad_right(b, self.device) for b in group]
            hidden, offload = final_states(
                self.sm, padded, self.activations, self.show_progress, f"lm-eval pass {self.passes}"
            )
            for batch, h in zip(group, hidden, strict=True):
                self._score(requests, batch, offload.fetch(h), [users[rows[s]] for s in batch], results)
            del hidden
        return results  # type: ignore[return-value]

    def _passes(self, batches: list[list[tuple[int, ...]]]):
        """Consecutive groups of batches whose padded tokens fit one pass's budget (at least one batch)."""
        group: list[list[tuple[int, ...]]] = []
        tokens = 0
        for batch in batches:
            cost = len(batch) * len(batch[0])  # padded to its first, longest, sequence
            if group and tokens + cost > self.pass_tokens:
                yield group
                group, tokens = [], 0
            group.append(batch)
            tokens += cost
        if group:
            yield group

    def _score(self, requests, batch, h: torch.Tensor, readers: list[list[int]], results: list) -> None:
        """Fill ``results`` for the requests reading the rows of one batch from its last hidden states."""
        picks: list[tuple[int, int]] = []  # (row in batch, position) whose next-token logits are read
        spans: list[tuple[int, int]] = []  # per row: its first pick and how many
        for b, seq in enumerate(batch):
            longest = max(len(requests[r][2]) for r in readers[b])
            n = min(longest, len(seq))
            spans.append((len(picks), n))
            picks.extend((b, p) for p in range(len(seq) - n, len(seq)))
        index = torch.tensor(picks, device=h.device)
        logp = F.log_softmax(self._logits(h[index[:, 0], index[:, 1]]).float(), dim=-1)
        greedy = logp.argmax(-1)
        for b, (start, n) in enumerate(spans):
            for r in readers[b]:
                request_str, _, continuation = requests[r]
                k = min(len(continuation), n)
                target = torch.tensor(continuation[-k:], device=h.device)
                rows = slice(start + n - k, start + n)
                answer = (float(logp[rows].gather(1, target[:, None]).sum()), bool((greedy[rows] == target).all()))
                results[r] = answer
                if request_str is not None:
                    self.cache_hook.add_partial("loglikelihood", request_str, answer)


def _pad_right(batch: list[tuple[int, ...]], device) -> torch.Tensor:
    """Token rows padded with 0 on the right to the longest (causal: no real position sees them)."""
    out = torch.zeros(len(batch), max(map(len, batch)), dtype=torch.long)
    for i, seq in enumerate(batch):
        out[i, : len(seq)] = torch.tensor(seq)
    return out.to(device)


def evaluate_lm_eval_streamed(
    directory: str | Path,
    tasks: str | Sequence[str] | TaskSelection,
    *,
    tokenizer=None,
    batch_size: int = 8,
    limit: int | float | None = None,
    num_fewshot: int | None = None,
    device: str = "auto",
    dtype: str = "auto",
    task_dir: str | Path | None = None,
    bootstrap_iters: int = 1000,
    seed: int = 0,
    activations: str = "auto",
    pass_bytes: int | None = None,
    show_progress: bool = False,
) -> dict[str, Any]:
    """:func:`core.evaluation.lmeval.evaluate_lm_eval` of a checkpoint directory read block by block
    (for a model bigger than the device); the same result dict, plus ``passes`` (reads of the model).
    ``pass_bytes`` caps the hidden states of one pass (default: half the host's available memory)."""
    selection = tasks if isinstance(tasks, TaskSelection) else select_tasks(tasks, task_dir)
    kinds: dict[str, str] = {}
    specs = load_tasks(selection, kinds)
    generating = sorted(name for name, kind in kinds.items() if kind == "generate_until")
    if generating:
        raise ValueError(
            f"task(s) {', '.join(generating)} generate text, which a streamed evaluation cannot do (it scores "
            "log-likelihoods block by block); evaluate them with the model in memory"
        )
    sm = open_decoder(directory, dtype, device, what="lm-eval tasks")
    try:
        if tokenizer is None:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(directory, config=sm.model.config)
        ensure_pad_token(tokenizer)
        lm = StreamedLM(sm, tokenizer, batch_size, activations, pass_bytes, show_progress)
        out = run_harness(lm, selection, specs, num_fewshot, limit, bootstrap_iters, seed)
    finally:
        sm.close()
    # the skeleton's parameters have their shapes (on the meta device): counted as in memory
    return {**out, "parameters": sum(p.numel() for p in sm.model.parameters()), "passes": lm.passes}
