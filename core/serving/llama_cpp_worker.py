"""Runs inside llama.cpp's Python environment (``llama-cpp-python``), never imported by the project.

It imports only the standard library, numpy and ``llama_cpp``, so the environment that holds the
engine needs nothing of ours. One request per call, as JSON in ``argv[1]``; one JSON answer on stdout:

    {"op": "quantize", "src": F, "dst": F, "type": T, "threads": N, "imatrix": F|null}   T: QUANT_TYPES
    {"op": "imatrix", "path": F}                                          an importance matrix as llama.cpp reads it
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
    "q5_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M,
    "q4_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M,
    "q3_k_m": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M,
    "iq3_xxs": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ3_XXS,
    "iq2_m": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ2_M,
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


class _GgufInit(ctypes.Structure):
    _fields_ = [("no_alloc", ctypes.c_bool), ("ctx", ctypes.POINTER(ctypes.c_void_p))]


def _ggml():
    """llama.cpp's own GGUF reader (libggml-base, shipped with the binding), typed for the calls below."""
    import glob
    import os

    found = glob.glob(os.path.join(os.path.dirname(llama_cpp.__file__), "lib", "libggml-base.*"))
    lib = ctypes.CDLL(found[0])
    p, c = ctypes.c_void_p, ctypes.c_char_p
    for name, args, res in (
        ("gguf_init_from_file", [c, _GgufInit], p), ("gguf_free", [p], None), ("ggml_free", [p], None),
        ("gguf_find_key", [p, c], ctypes.c_int64), ("gguf_get_val_u32", [p, ctypes.c_int64], ctypes.c_uint32),
        ("gguf_get_val_str", [p, ctypes.c_int64], c), ("ggml_get_first_tensor", [p], p),
        ("ggml_get_next_tensor", [p, p], p), ("ggml_get_name", [p], c), ("ggml_nelements", [p], ctypes.c_int64),
        ("ggml_get_data_f32", [p], ctypes.POINTER(ctypes.c_float)), ("gguf_find_tensor", [p, c], ctypes.c_int64),
        ("gguf_get_tensor_type", [p, ctypes.c_int64], ctypes.c_int),
    ):  # fmt: skip
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.argtypes, fn.restype = args, res
    return lib


def read_imatrix(path: str) -> tuple[dict, int]:
    """{tensor: E[x²] per column} and the chunk count, read as llama-quantize reads a GGUF importance
    matrix (common_imatrix_load, then the division of each tensor's sums by its count)."""
    lib, ctx = _ggml(), ctypes.c_void_p()
    g = lib.gguf_init_from_file(path.encode(), _GgufInit(False, ctypes.pointer(ctx)))
    if not g:
        raise ValueError(f"llama.cpp cannot read {path} as GGUF")
    try:
        key = lib.gguf_find_key(g, b"imatrix.chunk_count")
        chunks = int(lib.gguf_get_val_u32(g, key)) if key >= 0 else 0
        found: dict[str, list] = {}
        t = lib.ggml_get_first_tensor(ctx)
        while t:
            name = lib.ggml_get_name(t).decode()
            for suffix, slot in ((".in_sum2", 0), (".counts", 1)):
                if name.endswith(suffix):
                    if lib.gguf_get_tensor_type(g, lib.gguf_find_tensor(g, name.encode())) != 0:  # GGML_TYPE_F32
                        raise ValueError(f"{name} is not float32")
                    values = np.ctypeslib.as_array(lib.ggml_get_data_f32(t), (int(lib.ggml_nelements(t)),))
                    found.setdefault(name[: -len(suffix)], [None, None])[slot] = values.copy()
            t = lib.ggml_get_next_tensor(ctx, t)
    finally:
        lib.gguf_free(g)
        lib.ggml_free(ctx)
    means = {}
    for name, (sums, counts) in found.items():
        if sums is None or counts is None:
            raise ValueError(f"mismatched sums and counts for {name}")
        per = sums.reshape(len(counts), -1)
        means[name] = np.concatenate([r / c if c > 0 else np.ones_like(r) for r, c in zip(per, counts)])
    return {n: v.astype(np.float32) for n, v in means.items()}, chunks


def imatrix(req: dict) -> dict:
    means, chunks = read_imatrix(req["path"])
    return {"ok": True, "chunks": chunks, "tensors": {n: [len(v), float(v.mean())] for n, v in means.items()}}


def quantize(req: dict) -> dict:
    params = llama_cpp.llama_model_quantize_default_params()
    params.ftype = QUANT_TYPES[req["type"]]
    params.nthread = int(req.get("threads", 2))
    keep = []  # the arrays the quantizer reads must outlive the call
    if req.get("imatrix"):
        means, _ = read_imatrix(req["imatrix"])
        entries = (llama_cpp.llama_model_imatrix_data * (len(means) + 1))()
        for i, (name, values) in enumerate(sorted(means.items())):
            data = np.ascontiguousarray(values, dtype=np.float32)
            keep += [name.encode(), data]
            entries[i].name = keep[-2]
            entries[i].data = data.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = data.size
        entries[len(means)].name = None  # the terminator llama.cpp stops at
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
        keep.append(entries)
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


OPS = {
    "quantize": quantize,
    "imatrix": imatrix,
    "logits": logits,
    "nll": nll,
    "tokenize": tokenize,
    "speed": speed,
    "info": info,
}

if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    try:
        answer = OPS[request["op"]](request)
    except Exception as exc:  # one line back to the caller, whatever llama.cpp raised
        answer = {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    print(json.dumps(answer))
