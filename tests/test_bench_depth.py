"""The depth benchmarks' pages for models other than SmolLM2 (``bench/depth.py``, ``bench/depth_speed.py``):
rendered from a results dict, no model built."""

from types import SimpleNamespace

import pytest

from bench import depth, depth_speed

REFUSAL = "Gemma 3 (text) normalises the FFN's output before the residual stream, so …"


def _spans(n: int, ls: bool) -> dict:
    extra = lambda s: {"heldout_loss_ls": 2.0 + s / 100, "ls_error": 0.2} if ls else {}  # noqa: E731
    return {
        str(s): {"plain_error": s / 10, "angular": s / 20, "heldout_loss_none": 3 + s / 10} | extra(s)
        for s in range(1, n)
    }


def _row(selection: str, start: int, method: str, ppl: float | None = None, **flags) -> dict:
    row = {"selection": depth.SELECTIONS[selection], "start": start, "method": method}
    return row | ({"perplexity": ppl} if ppl is not None else flags)


BASE = {
    "date": "2026-11-28",
    "machine": "Intel(R) Xeon(R) Processor, 2 cores",
    "torch": "2.13.0+cpu",
    "weights": "float32",
}


@pytest.fixture
def pages(tmp_path, monkeypatch):
    monkeypatch.setattr(depth, "out_path", lambda m: tmp_path / f"depth_{m}.md")
    monkeypatch.setattr(depth_speed, "out_path", lambda m: tmp_path / f"depth_speed_{m}.md")
    return tmp_path


def test_a_family_that_refuses_the_stand_in_gets_plain_rows_and_the_refusal_quoted(pages):
    r = BASE | {
        "model": "gemma3",
        "label": "Gemma 3 270M",
        "family": "Gemma 3 (text)",
        "blocks_removed": 4,
        "blocks_total": 18,
        "ls_refused": REFUSAL,
        "ffn_output_norm": "post_feedforward_layernorm",
        "dense": 60.0,
        "spans": _spans(15, ls=False),
        "rows": [
            _row("plain", 2, "none", 200.0),
            _row("angular", 2, "none", same_as_above=True),
            _row("sleb", 9, "none", 120.0),
        ],
    }
    depth.write(r)
    page = (pages / "depth_gemma3.md").read_text()
    assert REFUSAL in page and "post_feedforward_layernorm" in page
    assert "| held-aside loss, span removed (SLEB) | 9–12 | none | 120.0 |" in page
    assert "| ls" not in page and "ls fit error" not in page
    assert "SLEB's criterion picks 9–12 (perplexity 120.0 removed, 2.00× dense); the angular distance picks 2–5" in page


def test_a_foldable_family_compares_the_stand_in_on_the_best_plain_span(pages):
    r = BASE | {
        "model": "qwen25",
        "label": "Qwen2.5-Coder-0.5B-Instruct",
        "family": "Qwen2",
        "blocks_removed": 6,
        "blocks_total": 24,
        "weighting": "per-token 1/‖y‖",
        "ours_weighting": "plain",
        "dense": 20.0,
        "spans": _spans(19, ls=True),
        "rows": [
            _row("plain", 5, "none", 90.0),
            _row("plain", 5, "ls", 45.0),
            _row("angular", 3, "none", not_evaluated=True),
            _row("angular", 3, "ls", not_evaluated=True),
            _row("sleb", 5, "none", same_as_above=True),
            _row("sleb", 5, "ls", same_as_above=True),
            _row("ours", 6, "none", 95.0),
            _row("ours", 6, "ls", 40.0),
        ],
    }
    depth.write(r)
    page = (pages / "depth_qwen25.md").read_text()
    assert "stand-in over plain removal: **0.50×**" in page
    assert "| angular distance (ShortGPT) | 3–8 | none | not evaluated |" in page
    assert "a stock Qwen2 with 18 layers" in page


def test_the_quality_page_orders_the_recipes_and_says_why_depth_is_plain(pages):
    rows = [
        {"name": "depth 4 (22%), none", "removed_blocks": [9, 10, 11, 12], "layers": 14, "width_ratio": None}
        | {"achieved_ratio": 0.222, "perplexity": 120.0, "depth_reconstruction": "none"},
        {"name": "dense", "removed_blocks": [], "layers": 18, "width_ratio": None, "achieved_ratio": 0.0}
        | {"perplexity": 60.0, "ls_refused": REFUSAL},
        {"name": "width 22%", "removed_blocks": [], "layers": 18, "width_ratio": None, "achieved_ratio": 0.222}
        | {"perplexity": 90.0},
    ]
    r = BASE | {"model": "gemma3", "label": "Gemma 3 270M", "threads": 2, "rows": []}
    depth_speed.write(r | {"untimed": [x | {"date": "2026-11-28"} for x in rows]})
    page = (pages / "depth_speed_gemma3.md").read_text()
    table = [line for line in page.splitlines() if line.startswith("| ") and "recipe" not in line]
    assert [line.split(" | ")[0] for line in table] == ["| dense", "| width 22%", "| depth 4 (22%), none"]
    assert "| depth 4 (22%), none | 22.2% | 14 | 9–12 | none | – | 120.0 (2.00×) |" in table
    assert REFUSAL in page


def test_the_stand_in_refusal_is_the_recipe_checks_own_sentence(tmp_path):
    gemma = SimpleNamespace(model_type="gemma3_text", num_hidden_layers=18)
    assert depth.ls_refusal(str(tmp_path), gemma, 4).startswith("Gemma 3 (text) normalises the FFN's output")
    assert depth.ls_refusal(str(tmp_path), SimpleNamespace(model_type="qwen2", num_hidden_layers=24), 6) is None


def test_another_models_timed_run_is_refused(monkeypatch):
    monkeypatch.setattr("sys.argv", ["depth_speed.py", "--model", "gemma3"])
    with pytest.raises(SystemExit):
        depth_speed.main()
