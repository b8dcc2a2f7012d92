"""Streamed execution (one block at a time from the checkpoint's shards) against the in-memory path."""

import errno
import hashlib
import json
import shutil
import threading

import pytest
import torch
from safetensors.torch import load_file, save_file

from core import load_pruned, prune
from core.evaluation.perplexity import perplexity, perplexity_streamed
from core.models import safetensors_io
from core.models.manifest import read_manifest
from core.models.safetensors_io import CheckpointError, CheckpointReader, write_shard
from core.models.streaming import StreamedModel, params_on_meta
from core.pipeline.streamed import ShardWriter, WriteBlocks
from tests.conftest import fast_first, recipe_for


def _both(model_dir, corpus, tmp_path, **kw):
    """The same recipe run in memory and streamed; returns both saved checkpoints and results."""
    recipe = recipe_for(model_dir, corpus, device="cpu", round_to={"neurons": 1}, **kw)
    memory = prune({**recipe, "execution": "memory"})
    memory_dir = memory.save(tmp_path / "memory")
    streamed = prune({**recipe, "execution": "stream"}, output_dir=tmp_path / "stream")
    assert streamed.streamed and streamed.model is None
    stream_dir = streamed.save(tmp_path / "stream")
    return memory, memory_dir, streamed, stream_dir


def _assert_same_checkpoint(memory_dir, stream_dir, atol=1e-6):
    a, _ = load_pruned(memory_dir)
    b, _ = load_pruned(stream_dir)
    sa, sb = a.state_dict(), b.state_dict()
    assert sa.keys() == sb.keys()
    for name in sa:
        assert sa[name].shape == sb[name].shape, name
        torch.testing.assert_close(sb[name], sa[name], atol=atol, rtol=0, msg=name)
    ca, cb = (json.loads((d / "config.json").read_text()) for d in (memory_dir, stream_dir))
    assert ca == cb


@pytest.mark.parametrize(
    ("family", "kw"),
    fast_first(
        3,
        [
            ("llama", {}),
            ("llama", {"modules": "heads", "reconstruction": {"method": "ls", "damp": 0.0}}),
            ("llama", {"modules": "neurons", "reconstruction": {"method": "bias"}}),
            ("llama", {"criterion": {"name": "flap", "options": {"structure": "AL-AM"}}, "allocation": "global"}),
            ("llama", {"reconstruction": {"method": "mask_tuning"}}),
            ("llama", {"reconstruction": {"method": "none"}, "calibration": {"holdout_samples": 0}}),
            ("llama", {"criterion": {"name": "random"}, "allocation": "global"}),
            ("qwen2", {"criterion": {"name": "flap"}}),
            ("llama", {"criterion": {"name": "obs"}, "allocation": "global"}),
            ("qwen2", {"criterion": {"name": "obs", "options": {"max_layer_ratio": 0.8}}, "allocation": "global"}),
            ("mistral", {"modules": "neurons", "criterion": {"name": "kcm"}}),
            ("bert", {}),
            ("bert", {"criterion": {"name": "flap"}, "reconstruction": {"method": "bias"}}),
        ],
    ),
)
def test_streamed_equals_in_memory(family, kw, model_dirs, mistral_dir, corpus, tmp_path):
    model_dir = {**model_dirs, "mistral": mistral_dir}[family]
    memory, memory_dir, streamed, stream_dir = _both(model_dir, corpus, tmp_path, **kw)
    assert streamed.metrics["execution"] == "stream" and memory.metrics["execution"] == "memory"
    units = lambda r: [[list(map(int, u)) for u in (lp.heads, lp.kv_heads, lp.neurons)] for lp in r.plan.layers]  # noqa: E731
    assert units(streamed) == units(memory)
    for a, b in zip(memory.report, streamed.report, strict=True):
        assert (a.layer, a.module, a.kept) == (b.layer, b.module, b.kept)
        assert b.error_after == pytest.approx(a.error_after, rel=1e-6, abs=1e-9)
    assert (streamed.params_before, streamed.params_after) == (memory.params_before, memory.params_after)
    _assert_same_checkpoint(memory_dir, stream_dir)
    metrics = json.loads((stream_dir / "metrics.json").read_text())
    assert metrics["stock_architecture"] == json.loads((memory_dir / "metrics.json").read_text())["stock_architecture"]


def test_streamed_model_with_tied_embeddings(corpus, tmp_path):
    """The head shares the input embeddings (SmolLM2, Gemma): the embeddings are still loaded for the
    block inputs, and the output stores the tied tensor once, as in memory."""
    from core.models.tiny import tiny_decoder

    tied = tiny_decoder(tmp_path / "tied", tie_word_embeddings=True)
    (tmp_path / "runs").mkdir()
    _, memory_dir, _, stream_dir = _both(tied, corpus, tmp_path / "runs")
    _assert_same_checkpoint(memory_dir, stream_dir)
    model, _ = load_pruned(stream_dir)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()


@pytest.mark.parametrize("tied", [False, True])
def test_the_embeddings_are_not_held_while_blocks_are_scored_or_pruned(corpus, tmp_path, monkeypatch, tied):
    """A vocabulary's table is the largest tensor outside the blocks (0.93 GB for Qwen2.5-1.5B's in
    float32, untied): it is read for the calibration's block inputs and released, in the scoring pass
    as in the pruning pass, so no block is ever read while it is held; the result is the in-memory one."""
    from core.models.tiny import tiny_decoder

    model_dir = tiny_decoder(tmp_path / "m", tie_word_embeddings=tied)
    held = []
    load_block = StreamedModel.load_block

    def record(self, i, names=None):
        held.append(not self.model.get_input_embeddings().weight.is_meta)
        return load_block(self, i, names)

    monkeypatch.setattr(StreamedModel, "load_block", record)
    (tmp_path / "runs").mkdir()
    _, memory_dir, _, stream_dir = _both(model_dir, corpus, tmp_path / "runs", criterion={"name": "obs"})
    assert len(held) == 4 and not any(held)  # 2 blocks scored, then 2 pruned
    _assert_same_checkpoint(memory_dir, stream_dir)


def test_streamed_stock_form_with_added_biases_loads_with_from_pretrained(llama_dir, corpus, tmp_path):
    """Uniform widths and an added FFN bias: the stock form needs zero biases on the other FFN
    projections, written as their own shard; plain ``from_pretrained`` loads the result."""
    from transformers import AutoModelForCausalLM

    _, memory_dir, streamed, stream_dir = _both(
        llama_dir, corpus, tmp_path, modules="neurons", reconstruction={"method": "bias"}
    )
    assert streamed.stock
    assert (stream_dir / "model-zero-biases.safetensors").is_file()
    _assert_same_checkpoint(memory_dir, stream_dir)
    model = AutoModelForCausalLM.from_pretrained(stream_dir)
    assert model.config.mlp_bias and model.model.layers[0].mlp.up_proj.bias is not None


def test_streamed_checkpoint_manifest_matches_files(llama_dir, corpus, tmp_path):
    _, _, streamed, stream_dir = _both(llama_dir, corpus, tmp_path)
    entries = read_manifest(stream_dir)
    names = {e.name for e in entries}
    files = {p.name for p in stream_dir.iterdir() if p.name != "SHA256SUMS"}
    assert names == files
    for e in entries:
        data = (stream_dir / e.name).read_bytes()
        assert e.sha256 == hashlib.sha256(data).hexdigest() and e.size == len(data)
    index = json.loads((stream_dir / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"].values()) <= files
    # one shard for what lies outside the blocks, one per block
    assert len({f for f in files if f.startswith("model-000")}) == streamed.adapter.n_layers + 1


def test_streamed_perplexity_of_a_checkpoint_with_per_layer_widths(llama_dir, corpus, tmp_path):
    """A pruned checkpoint in the liar_ form (layers of different widths) streams too: its skeleton
    is built from the bundled classes, one block at a time."""
    result = prune(recipe_for(llama_dir, corpus, device="cpu", ratio=0.2), output_dir=tmp_path / "pruned")
    assert not result.stock
    stream_ppl = perplexity_streamed(result.checkpoint, result.tokenizer, corpus[:8], seq_len=24, device="cpu")
    pruned_dir = result.save(tmp_path / "pruned")
    model, tokenizer = load_pruned(pruned_dir)
    expected = perplexity(model, tokenizer, corpus[:8], seq_len=24)
    assert stream_ppl["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-5)


def test_streamed_perplexity_equals_in_memory(qwen2_dir, corpus):
    model, tokenizer = load_pruned(qwen2_dir)
    texts = corpus[:10]
    expected = perplexity(model, tokenizer, texts, seq_len=32, batch_size=3)
    got = perplexity_streamed(qwen2_dir, tokenizer, texts, seq_len=32, batch_size=3, device="cpu")
    assert got["windows"] == expected["windows"] and got["tokens"] == expected["tokens"]
    assert got["perplexity"] == pytest.approx(expected["perplexity"], rel=1e-5)


def test_skeleton_allocates_no_parameters_but_real_buffers(llama_dir):
    with params_on_meta():
        layer = torch.nn.Linear(1000, 1000)
    assert layer.weight.is_meta and layer.bias.is_meta
    sm = StreamedModel(llama_dir, torch.float32, torch.device("cpu"))
    assert all(p.is_meta for p in sm.model.parameters())
    buffers = dict(sm.model.named_buffers())
    assert buffers and all(not b.is_meta for b in buffers.values())
    sm.load_outer()
    layer = sm.load_block(1)
    assert not any(p.is_meta for p in layer.parameters())
    assert all(p.is_meta for p in sm.layers[0].parameters())
    sm.free_block(1)
    assert all(p.is_meta for p in layer.parameters())


@pytest.mark.parametrize("at_load", [True, False], ids=["gpu-style", "cpu-style"])
def test_prefetched_blocks_equal_synchronous_reads_and_are_read_in_the_background(llama_dir, monkeypatch, at_load):
    plain = StreamedModel(llama_dir, torch.float32, torch.device("cpu"), prefetch=False)
    ahead = StreamedModel(llama_dir, torch.float32, torch.device("cpu"))
    assert not ahead.prefetch_at_load  # on the CPU the caller starts the next read
    ahead.prefetch_at_load = at_load  # as on a GPU: loading block i starts reading block i + 1
    readers: dict[int, str] = {}
    read_block = StreamedModel._read_block

    def spy(self, i, names=None):
        if self is ahead:
            readers[i] = threading.current_thread().name
        return read_block(self, i, names)

    monkeypatch.setattr(StreamedModel, "_read_block", spy)
    for i in range(len(ahead.layers)):
        want = dict(plain.load_block(i).named_parameters())
        got = dict(ahead.load_block(i).named_parameters())
        if not at_load:
            assert not ahead._pending
            ahead.prefetch(i + 1)  # what the block loop does once block i's solves are done
        assert want.keys() == got.keys()
        for name in want:
            assert torch.equal(got[name], want[name]), (i, name)
        plain.free_block(i)
        ahead.free_block(i)
    n = len(ahead.layers)
    assert readers[0] == "MainThread"  # nothing was under way for the first block
    assert all(readers[i].startswith("liar-prefetch") for i in range(1, n))  # read while block i-1 ran
    assert not ahead._pending  # nothing read past the last block
    ahead.close()
    ahead.load_block(0)  # still works after close, synchronously
    assert not ahead._pending


def test_part_of_a_block_is_read_alone_and_a_prefetch_of_another_part_is_not_used(llama_dir):
    whole = StreamedModel(llama_dir, torch.float32, torch.device("cpu"), prefetch=False)
    part = StreamedModel(llama_dir, torch.float32, torch.device("cpu"))
    names = frozenset({"self_attn.o_proj.weight", "mlp.down_proj.weight"})
    want = dict(whole.load_block(1).named_parameters())
    got = dict(part.load_block(1, names).named_parameters())
    assert {n for n, p in got.items() if not p.is_meta} == names
    assert all(torch.equal(got[n], want[n]) for n in names)
    part.free_block(1)
    part.prefetch(1, names)  # read ahead for a scoring pass, then loaded whole: read again
    got = dict(part.load_block(1).named_parameters())
    assert got.keys() == want.keys() and all(torch.equal(got[n], want[n]) for n in want)
    assert not part._pending
    part.free_block(1)
    part.prefetch(1, names)
    got = dict(part.load_block(1, names).named_parameters())  # the same part: the prefetched read
    assert {n for n, p in got.items() if not p.is_meta} == names
    part.close()


@pytest.mark.parametrize(
    ("family", "criterion", "scored"),
    [
        ("llama", "magnitude", {"self_attn.o_proj.weight", "mlp.down_proj.weight"}),
        # bert: the output projections with their biases
        (
            "bert",
            "magnitude",
            {f"{p}.{w}" for p in ("attention.output.dense", "output.dense") for w in ("weight", "bias")},
        ),
        ("llama", "random", set()),
    ],
)
def test_a_weight_criterions_scoring_pass_reads_only_what_it_scores(
    family, criterion, scored, model_dirs, corpus, tmp_path, monkeypatch
):
    """Magnitude scores from the output projections alone, random from nothing: a streamed run's
    scoring pass reads only those (a fraction of each block, none for random), then the pruning pass
    reads every block whole; the result is the in-memory one (``test_streamed_equals_in_memory``)."""
    reads: list[tuple[int, set[str]]] = []
    read_block = StreamedModel._read_block

    def spy(self, i, names=None):
        out = read_block(self, i, names)
        reads.append((i, set(out)))
        return out

    monkeypatch.setattr(StreamedModel, "_read_block", spy)
    recipe = recipe_for(model_dirs[family], corpus, device="cpu", criterion={"name": criterion})
    result = prune({**recipe, "execution": "stream"}, output_dir=tmp_path / "out")
    n = result.adapter.n_layers
    assert [i for i, _ in reads] == list(range(n)) * 2
    assert all(names == scored for _, names in reads[:n])
    skeleton = StreamedModel(model_dirs[family], torch.float32, torch.device("cpu"), prefetch=False)  # no threads
    full = {name for name, _ in skeleton.layers[0].named_parameters()}
    assert all(names == full for _, names in reads[n:])


def test_a_block_read_by_several_threads_equals_one_read_by_one(llama_dir, monkeypatch):
    """With read threads (a GPU worker's default), a block's tensors are read at once — the first two
    reads meet at a barrier, which one thread reading them in turn would never reach — and the
    block equals the one read by a single thread."""
    one = StreamedModel(llama_dir, torch.float32, torch.device("cpu"), prefetch=False, read_threads=1)
    many = StreamedModel(llama_dir, torch.float32, torch.device("cpu"), prefetch=False, read_threads=3)
    barrier, threads = threading.Barrier(2, timeout=10), []
    read_host = many.reader.read_host

    def meet(name, pinned=False):
        threads.append(threading.current_thread().name)
        if len(threads) <= 2:
            barrier.wait()  # raises BrokenBarrierError when the second read does not start meanwhile
        return read_host(name, pinned)

    monkeypatch.setattr(many.reader, "read_host", meet)
    for i in range(len(one.layers)):
        want, got = dict(one.load_block(i).named_parameters()), dict(many.load_block(i).named_parameters())
        assert want.keys() == got.keys() and all(torch.equal(got[n], want[n]) for n in want), i
        one.free_block(i)
        many.free_block(i)
    assert len(threads) == sum(len(list(layer.parameters())) for layer in many.layers)
    assert all(name.startswith("liar-read") for name in threads)
    many.close()
    assert many._tensor_reads is None


@pytest.mark.slow
def test_a_streamed_run_with_several_io_threads_writes_the_same_checkpoint(llama_dir, corpus, tmp_path, monkeypatch):
    from core.models import streaming
    from core.pipeline import streamed

    recipe = recipe_for(llama_dir, corpus, device="cpu", execution="stream")
    a = prune(recipe, output_dir=tmp_path / "a").save(tmp_path / "a")
    for module in (streaming, streamed):  # as on a GPU worker: blocks read and shards written 3 at a time
        monkeypatch.setattr(module, "host_io_threads", lambda device: 3)
    b = prune(recipe, output_dir=tmp_path / "b").save(tmp_path / "b")
    for shard in sorted(a.glob("*.safetensors")):
        ta, tb = load_file(shard), load_file(b / shard.name)
        assert ta.keys() == tb.keys() and all(torch.equal(ta[k], tb[k]) for k in ta), shard.name
    digests = [[x for x in (d / "SHA256SUMS").read_text().splitlines() if ".safetensors" in x] for d in (a, b)]
    assert digests[0] == digests[1] and len(digests[0]) > 2  # the model card and metrics hold timings


def test_a_cpu_run_reads_the_next_block_only_after_the_solves_of_this_one(llama_dir, corpus, tmp_path, monkeypatch):
    from core.pipeline import blocks

    events: list[tuple[str, int]] = []
    prune_part, prefetch, read_block = blocks._prune_part, StreamedModel.prefetch, StreamedModel._read_block

    def logged_prune_part(loop, block, *args):
        lp = prune_part(loop, block, *args)
        events.append(("solved", block.index))
        return lp

    def logged_prefetch(self, i, names=None):
        events.append(("prefetch", i))
        prefetch(self, i, names)

    def logged_read(self, i, names=None):
        events.append(("read " + threading.current_thread().name.split("_")[0], i))
        return read_block(self, i, names)

    monkeypatch.setattr(blocks, "_prune_part", logged_prune_part)
    monkeypatch.setattr(StreamedModel, "prefetch", logged_prefetch)
    monkeypatch.setattr(StreamedModel, "_read_block", logged_read)
    recipe = recipe_for(llama_dir, corpus, device="cpu", execution="stream")
    prune(recipe, output_dir=tmp_path / "out").save(tmp_path / "out")
    recon = events[events.index(("solved", 0)) :]  # the block loop, from the first solve on
    n = max(i for kind, i in recon if kind == "solved") + 1
    assert n > 1
    for i in range(1, n):  # block i is asked for only after the last solve of block i - 1
        last_solve = max(k for k, e in enumerate(recon) if e == ("solved", i - 1))
        assert recon.index(("prefetch", i)) > last_solve, recon
    reads = [(kind, i) for kind, i in recon if kind.startswith("read")]
    assert reads == [("read liar-prefetch", i) for i in range(1, n)]  # each in the background, once
    # block 0 too: its read starts once the scoring pass is done, beside the plan and the embeddings
    before = events[: events.index(("solved", 0))]
    assert [e for e in before if e[0].startswith("read")][-1] == ("read liar-prefetch", 0)


def test_streamed_prune_without_prefetch_is_identical(llama_dir, corpus, tmp_path, monkeypatch):
    recipe = recipe_for(llama_dir, corpus, device="cpu", execution="stream")
    with_prefetch = prune(recipe, output_dir=tmp_path / "a").save(tmp_path / "a")
    original = StreamedModel.__init__
    monkeypatch.setattr(
        StreamedModel, "__init__", lambda self, d, dt, dev, prefetch=True, **kw: original(self, d, dt, dev, False, **kw)
    )
    without = prune(recipe, output_dir=tmp_path / "b").save(tmp_path / "b")
    a, b = (load_file(d / "model-00002-of-00003.safetensors") for d in (with_prefetch, without))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.slow
def test_auto_streams_only_when_saving_a_model_read_from_disk(llama_dir, corpus, tmp_path):
    recipe = recipe_for(llama_dir, corpus, device="cpu")
    assert prune(recipe).metrics["execution"] == "memory"  # the caller wants the model object
    result = prune(recipe, output_dir=tmp_path / "out")
    assert result.metrics["execution"] == "stream"
    result.discard()
    assert not list(tmp_path.iterdir())  # the unfinished checkpoint is gone
    snip = recipe_for(llama_dir, corpus, device="cpu", criterion={"name": "snip"})
    assert prune(snip, output_dir=tmp_path / "snip").metrics["execution"] == "memory"


@pytest.mark.slow
def test_host_memory_is_bounded_when_asked_to_stream_or_short(llama_dir, corpus, tmp_path, monkeypatch):
    """``execution: stream`` maps every allocation (memory first); ``auto`` streaming a model that is a
    small share of the memory available reuses freed memory, as an in-memory run does, and bounds it
    once the weights exceed that share. The policy set is the one reported."""
    import core.models.streaming as streaming

    applied = []
    monkeypatch.setattr(streaming, "release_freed_memory", lambda: applied.append("bounded"))
    monkeypatch.setattr(streaming, "keep_freed_memory", lambda: applied.append("reused"))
    recipe = recipe_for(llama_dir, corpus, device="cpu")
    runs = [
        ("stream", {**recipe, "execution": "stream"}, "bounded"),
        ("auto", recipe, "reused"),
    ]
    for name, r, policy in runs:
        result = prune(r, output_dir=tmp_path / name)
        assert result.metrics["execution"] == "stream"
        assert result.metrics["host_memory"] == policy and applied[-1] == policy
        result.discard()
    monkeypatch.setattr(streaming, "available_memory", lambda: 1000)  # far below the tiny model's weights
    result = prune(recipe, output_dir=tmp_path / "short")
    assert result.metrics["host_memory"] == "bounded" and applied[-1] == "bounded"
    result.discard()
    assert prune(recipe).metrics["host_memory"] == "reused"  # in memory: the model is held anyway


def test_whole_model_gradient_criteria_are_refused_when_streaming(llama_dir, corpus, tmp_path):
    recipe = recipe_for(llama_dir, corpus, device="cpu", criterion={"name": "taylor"}, execution="stream")
    with pytest.raises(ValueError, match="needs gradients of the whole model.*execution: memory.*magnitude"):
        prune(recipe, output_dir=tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ValueError, match="give an output directory"):
        prune({**recipe, "criterion": {"name": "magnitude"}})


def _sharded_copy(src, dst):
    """``src`` (one model.safetensors) rewritten as two shards with an index."""
    shutil.copytree(src, dst)
    tensors = load_file(dst / "model.safetensors")
    (dst / "model.safetensors").unlink()
    names = sorted(tensors)
    half = len(names) // 2
    weight_map = {}
    for i, part in enumerate((names[:half], names[half:]), 1):
        file = f"model-0000{i}-of-00002.safetensors"
        save_file({n: tensors[n] for n in part}, dst / file, metadata={"format": "pt"})
        weight_map.update({n: file for n in part})
    (dst / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    return dst


def test_missing_or_truncated_shard_is_named_and_nothing_is_written(llama_dir, corpus, tmp_path):
    sharded = _sharded_copy(llama_dir, tmp_path / "sharded")
    recipe = recipe_for(sharded, corpus, device="cpu", execution="stream")
    shard = sharded / "model-00002-of-00002.safetensors"
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) - 100])
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors.*truncated"):
        prune(recipe, output_dir=tmp_path / "out")
    shard.unlink()
    with pytest.raises(CheckpointError, match="model-00002-of-00002.safetensors.*missing"):
        prune(recipe, output_dir=tmp_path / "out")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sharded"]


def test_disk_full_while_writing_leaves_no_checkpoint(llama_dir, corpus, tmp_path, monkeypatch):
    real = safetensors_io.write_shard
    calls = []

    def failing(path, tensors):
        calls.append(path)
        if len(calls) == 2:  # the first block's shard
            raise OSError(errno.ENOSPC, f"disk full while writing {str(path)!r}")
        return real(path, tensors)

    monkeypatch.setattr("core.pipeline.streamed.write_shard", failing)
    with pytest.raises(OSError, match="disk full while writing"):
        prune(recipe_for(llama_dir, corpus, device="cpu"), output_dir=tmp_path / "out")
    assert not list(tmp_path.iterdir())


def test_a_block_is_written_while_the_next_one_is_pruned(llama_dir, corpus, tmp_path, monkeypatch):
    """The first block's shard is held back until the run has loaded the second block: a writer that
    blocked the block loop would never get there. The checkpoint still matches its digests."""
    real = safetensors_io.write_shard
    second_block = threading.Event()
    overlapped = []

    def slow(path, tensors):
        if path.name.startswith("model-00002-"):  # block 0's shard
            overlapped.append(second_block.wait(timeout=30))
        return real(path, tensors)

    real_load = WriteBlocks.load

    def load(self, i):  # the pruning pass's loads (the scoring pass reads every block before)
        if i == 1:
            second_block.set()
        return real_load(self, i)

    monkeypatch.setattr("core.pipeline.streamed.write_shard", slow)
    monkeypatch.setattr(WriteBlocks, "load", load)
    result = prune(recipe_for(llama_dir, corpus, device="cpu"), output_dir=tmp_path / "out")
    out = result.save(tmp_path / "out")
    assert overlapped == [True]
    entries = read_manifest(out)
    assert sum(e.name.endswith(".safetensors") for e in entries) == result.adapter.n_layers + 1
    for e in entries:
        assert hashlib.sha256((out / e.name).read_bytes()).hexdigest() == e.sha256, e.name
    model, _ = load_pruned(out)
    assert sum(p.numel() for p in model.parameters()) == result.params_after


def test_a_failed_run_waits_for_the_shard_in_flight_before_removing_its_files(llama_dir, corpus, tmp_path, monkeypatch):
    """A run failing while a shard is being written leaves nothing behind, not even that shard."""
    real = safetensors_io.write_shard
    writing = threading.Event()

    def slow(path, tensors):
        if path.name.startswith("model-00002-"):
            writing.set()
            threading.Event().wait(0.5)  # still writing when the run fails
        return real(path, tensors)

    real_load = WriteBlocks.load

    def load(self, i):
        if i == 1:
            assert writing.wait(timeout=30)
            raise RuntimeError("block 1 could not be read")
        return real_load(self, i)

    monkeypatch.setattr("core.pipeline.streamed.write_shard", slow)
    monkeypatch.setattr(WriteBlocks, "load", load)
    with pytest.raises(RuntimeError, match="block 1 could not be read"):
        prune(recipe_for(llama_dir, corpus, device="cpu"), output_dir=tmp_path / "out")
    assert not list(tmp_path.iterdir())


def test_the_writer_thread_waits_for_the_copies_to_the_host_before_it_reads_them(tmp_path, monkeypatch):
    """On a GPU a block's copies to pinned memory are queued, not waited for by the main thread: the
    writer thread must wait for them (``ready``) before it hashes a byte. Here ``ready`` blocks until
    the main thread has moved on, and the write must come after it, in the writer's thread."""
    real = safetensors_io.write_shard
    events, released = [], threading.Event()

    def ready():
        events.append(("ready", threading.current_thread().name))
        assert released.wait(timeout=30)  # the copies land only after submit has returned

    def write(path, tensors):
        events.append(("write", threading.current_thread().name))
        return real(path, tensors)

    monkeypatch.setattr("core.pipeline.streamed.write_shard", write)
    writer = ShardWriter(tmp_path, in_flight=1)
    writer.submit("a.safetensors", [("w", torch.ones(3))], ready=ready)
    events.append(("submitted", threading.current_thread().name))  # submit did not wait for ready
    released.set()
    writer.wait()
    writer.close()
    kinds = [e for e, _ in events]
    assert sorted(kinds) == ["ready", "submitted", "write"]
    assert kinds.index("ready") < kinds.index("write") and kinds.index("submitted") < kinds.index("write")
    assert events[-1][1].startswith("liar-write") and dict(events)["ready"].startswith("liar-write")
    assert torch.equal(load_file(tmp_path / "a.safetensors")["w"], torch.ones(3))


def test_a_cpu_block_goes_to_the_writer_as_its_own_tensors():
    """HostCopy copies only what is on a GPU; a CPU run's block is handed over as it is, and waiting
    for it is immediate."""
    from core.pipeline.streamed import HostCopy

    t = torch.randn(4, 3)
    copy = HostCopy([("w", t)])
    copy.wait()
    assert copy.tensors[0][0] == "w" and copy.tensors[0][1] is t


def test_shard_writer_writes_in_flight_shards_at_once_and_never_more(tmp_path, monkeypatch):
    real = safetensors_io.write_shard
    lock, running, most = threading.Lock(), [0], [0]
    both = threading.Barrier(2, timeout=30)  # the first two writes must run side by side

    def tracked(path, tensors):
        with lock:
            running[0] += 1
            most[0] = max(most[0], running[0])
        try:
            if path.name in ("a.safetensors", "b.safetensors"):
                both.wait()
            threading.Event().wait(0.05)
            return real(path, tensors)
        finally:
            with lock:
                running[0] -= 1

    monkeypatch.setattr("core.pipeline.streamed.write_shard", tracked)
    writer = ShardWriter(tmp_path, in_flight=2)
    shards = {name: [(f"{name}.w", torch.randn(8, 8))] for name in "abcde"}
    for name, tensors in shards.items():
        writer.submit(f"{name}.safetensors", tensors)
    writer.wait()
    writer.close()
    assert most[0] == 2
    assert writer.weight_map == {f"{n}.w": f"{n}.safetensors" for n in shards}
    for name, tensors in shards.items():
        path = tmp_path / f"{name}.safetensors"
        assert writer.digests[path.name] == hashlib.sha256(path.read_bytes()).hexdigest()
        assert torch.equal(load_file(path)[f"{name}.w"], tensors[0][1])


def test_shard_writer_raises_a_failed_write_at_the_next_wait(tmp_path, monkeypatch):
    real = safetensors_io.write_shard

    def failing(path, tensors):
        if path.name == "b.safetensors":
            raise OSError(errno.ENOSPC, f"disk full while writing {str(path)!r}")
        return real(path, tensors)

    monkeypatch.setattr("core.pipeline.streamed.write_shard", failing)
    writer = ShardWriter(tmp_path, in_flight=2)
    for name in "abc":
        writer.submit(f"{name}.safetensors", [("x", torch.ones(3))])
    with pytest.raises(OSError, match="disk full while writing .*b.safetensors"):
        writer.wait()
    writer.close()  # after a failure: returns, the writes in flight done
    assert "a.safetensors" in writer.digests and "b.safetensors" not in writer.digests
    with pytest.raises(ValueError, match="in_flight must be at least 1"):
        ShardWriter(tmp_path, in_flight=0)


def test_reader_and_writer_round_trip_against_safetensors(tmp_path):
    tensors = [
        ("a.weight", torch.randn(3, 5)),
        ("b", torch.randn(7).to(torch.bfloat16)),
        ("empty", torch.zeros(0, 4)),
        ("ids", torch.arange(5)),
        ("half", torch.randn(2, 2).half()),
    ]
    digest = write_shard(tmp_path / "model.safetensors", tensors)
    assert digest == hashlib.sha256((tmp_path / "model.safetensors").read_bytes()).hexdigest()
    loaded = load_file(tmp_path / "model.safetensors")  # the reference reader accepts the file
    reader = CheckpointReader(tmp_path)
    for name, t in tensors:
        assert torch.equal(loaded[name], t) and torch.equal(reader.read(name), t)
    assert reader.read("a.weight", dtype=torch.float64).dtype == torch.float64


def test_disk_full_in_writer_is_one_sentence_naming_the_file(tmp_path, monkeypatch):
    import builtins

    real_open = builtins.open

    class Full:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(builtins, "open", lambda p, mode="r", *a, **k: Full(real_open(p, mode, *a, **k)))
    with pytest.raises(OSError, match=r"^\[Errno \d+\] disk full while writing '.*shard.safetensors'$"):
        write_shard(tmp_path / "shard.safetensors", [("x", torch.ones(2))])


def test_block_speed_is_measured_before_and_after_pruning(llama_dir, corpus, tmp_path):
    result = prune(recipe_for(llama_dir, corpus, device="cpu"), output_dir=tmp_path / "out", measure_speed=True)
    m = result.metrics
    assert m["block_seconds_dense"] > 0 and m["block_seconds_pruned"] > 0
    assert m["block_speedup_low"] <= m["block_speedup"] <= m["block_speedup_high"] and m["block_speedup_repeats"] == 5
    assert "block_speedup" not in prune(recipe_for(llama_dir, corpus, device="cpu")).metrics
    result.discard()


def test_a_disk_too_small_is_refused_before_anything_is_written(llama_dir, corpus, tmp_path, monkeypatch):
    import shutil as sh

    from core.pipeline.streamed import InsufficientDiskSpace

    monkeypatch.setattr(sh, "disk_usage", lambda path: sh._ntuple_diskusage(10**9, 10**9 - 1000, 1000))
    with pytest.raises(InsufficientDiskSpace, match=r"need about 0\.\d\d GB and 0\.00 GB are free"):
        prune(recipe_for(llama_dir, corpus, device="cpu"), output_dir=tmp_path / "out")
    assert not list(tmp_path.iterdir())


def test_streaming_refusal_is_known_without_torch_and_matches_the_registry():
    """The torch-free recipe check (what a job submission runs) refuses exactly the criteria whose
    implementation needs whole-model gradients."""
    from pydantic import ValidationError

    from core import criteria
    from core.spec.criteria import WHOLE_MODEL_GRADIENTS
    from core.spec.recipe import Recipe

    assert set(WHOLE_MODEL_GRADIENTS) == {n for n, c in criteria.REGISTRY.items() if c.needs == "gradients"}
    for name in WHOLE_MODEL_GRADIENTS:
        with pytest.raises(ValidationError, match="needs gradients of the whole model"):
            Recipe(model="m", ratio=0.2, calibration={"texts": ["x"]}, criterion={"name": name}, execution="stream")
        Recipe(model="m", ratio=0.2, calibration={"texts": ["x"]}, criterion={"name": name}, execution="auto")
