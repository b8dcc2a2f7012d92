"""Runs inside llama.cpp's Python environment (``llama-cpp-python``), never imported by the project.

It imports only the standard library, numpy and ``llama_cpp``, so the environment that holds the
engine needs nothing of ours. One request per call, as JSON in ``argv[1]``; one JSON answer on stdout:

    {"op": "quantize", "src": F, "dst": F, "type": "q8_0"|"q4_k_m", "threads": N}
    {"op": "logits", "model": F, "tokens": [[ids…], …], "out": F.npy}     every position's logits
    {"op": "nll", "model": F, "windows": [[ids…], …]}                     summed NLL of next tokens
    {"op": "tokenize", "model": F, "texts": [s, …]}
    {"op": "speed", "model": F, "prompt": [ids…], "decode": N, "threads": N, "rounds": N, "warmup": N}
    {"op": "info", "model": F}                                            the file's metadata
"""

from __future__ import annotations

import ctypes
import json
import sys
import time

import llama_cpp
import numpy as np

QUANT_TYPES = {
    "f16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16,
    "q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
}


def _load(path: str, n_ctx: int, threads: int, logits_all: bool):
    return llama_cpp.Llama(
        model_path=path,
        n_ctx=n_ctx,
        n_batch=min(n_ctx, 512),
        n_threads=threads,
        n_threads_batch=threads,
        logits_all=logits_all,
        verbose=False,
    )


def quantize(req: dict) -> dict:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[req["type"]]
    params.nthread = int(req.get("threads", 2))
    rc = llama_cpp.llama_model_quantize(req["src"].encode(), req["dst"].encode(), ctypes.byref(params))
    return {"ok": rc == 0, "rc": int(rc)}


def logits(req: dict) -> dict:
    seqs = req["tokens"]
    llm = _load(req["model"], max(len(s) for s in seqs) + 1, int(req.get("threads", 2)), True)
    out = np.full((len(seqs), max(len(s) for s in seqs), llm.n_vocab()), np.nan, dtype=np.float32)
    for i, s in enumerate(seqs):  # shorter sequences are padded with NaN
        llm.reset()
        llm.eval(s)
        out[i, : len(s)] = llm.scores[: len(s)]
    np.save(req["out"], out)
    return {"ok": True, "shape": list(out.shape)}


def nll(req: dict) -> dict:
    windows = req["windows"]
    llm = _load(req["model"], max(len(w) for w in windows) + 1, int(req.get("threads", 2)), True)
    total, count = 0.0, 0
    for w in windows:
        llm.reset()
        llm.eval(w)
        z = np.array(llm.scores[: len(w) - 1], dtype=np.float64)
        z -= z.max(axis=1, keepdims=True)
        logp = z - np.log(np.exp(z).sum(axis=1, keepdims=True))
        total -= float(logp[np.arange(len(w) - 1), w[1:]].sum())
        count += len(w) - 1
    return {"ok": True, "nll": total, "tokens": count}


def tokenize(req: dict) -> dict:
    llm = llama_cpp.Llama(model_path=req["model"], vocab_only=True, verbose=False)
    return {"ok": True, "ids": [llm.tokenize(t.encode(), add_bos=False, special=False) for t in req["texts"]]}


def speed(req: dict) -> dict:
    """Prefill tokens/s of the prompt and batch-1 greedy decode tokens/s, the median of the rounds
    (each round's own in ``*_rounds``); ``warmup`` rounds run first and are not counted."""
    prompt, n_decode, threads = req["prompt"], int(req["decode"]), int(req.get("threads", 2))
    llm = _load(req["model"], len(prompt) + n_decode + 1, threads, False)
    prefill, decode = [], []
    warmup = int(req.get("warmup", 0))
    for i in range(warmup + int(req.get("rounds", 3))):
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        t1 = time.perf_counter()
        for _ in range(n_decode):
            token = int(np.argmax(llm.scores[llm.n_tokens - 1]))
            llm.eval([token])
        t2 = time.perf_counter()
        if i >= warmup:
            prefill.append(len(prompt) / (t1 - t0))
            decode.append(n_decode / (t2 - t1))
    return {
        "ok": True,
        "prefill_tok_s": float(np.median(prefill)),
        "decode_tok_s": float(np.median(decode)),
        "prefill_rounds": prefill,
        "decode_rounds": decode,
    }


def info(req: dict) -> dict:
    llm = llama_cpp.Llama(model_path=req["model"], vocab_only=True, verbose=False)
    return {"ok": True, "metadata": dict(llm.metadata)}


OPS = {"quantize": quantize, "logits": logits, "nll": nll, "tokenize": tokenize, "speed": speed, "info": info}

if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    try:
        answer = OPS[request["op"]](request)
    except Exception as exc:  # one line back to the caller, whatever llama.cpp raised
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer))
