"""docs/results/family.md from its JSON (bench/family_page.py): the family line through the two dense
models, each pruned point's distance from it, and the family question's answer."""

import math

from bench import family_page


def _cell(model, ratio, ppl, tok_s, **kw):
    files = {q: {"mib": 100.0, "perplexity": ppl, "decode_tok_s": tok_s} for q in ("f16", "q4_k_m")}
    return {"model": model, "ratio": ratio, "params": 10**9, "perplexity": ppl, "files": files, **kw}


def _data(*pruned):
    cells = {"0.5B dense": _cell("0.5B", 0.0, 30.0, 40.0), "1.5B dense": _cell("1.5B", 0.0, 12.0, 20.0)}
    run = dict(peak_rss_mb=2048.0, job_seconds=600.0, estimate_seconds=500.0, gemm_gflops=130.0)
    for ratio, ppl, tok_s in pruned:
        cells[f"1.5B {ratio:g}"] = _cell("1.5B", ratio, ppl, tok_s, **run)
    machine = {"cpu": "AMD EPYC", "cores": 2, "torch_threads": 2, "torch": "2.13.0+cpu", "transformers": "5"}
    return {"machine": machine, "cells": cells}


def test_the_family_line_passes_through_both_dense_models_log_log():
    line = family_page.family_line(_data()["cells"])
    assert math.isclose(line(40.0), 30.0) and math.isclose(line(20.0), 12.0)
    # halfway in log decode time is the geometric mean in perplexity
    assert math.isclose(line(math.sqrt(40.0 * 20.0)), math.sqrt(30.0 * 12.0))


def test_the_page_names_the_largest_ratio_that_beats_the_small_model_and_each_points_distance():
    page = family_page.render(_data((0.35, 18.0, 26.0), (0.5, 25.0, 30.0), (0.65, 35.0, 34.0)))
    assert (
        "the largest at which the pruned 1.5B still has a lower held-out perplexity than the dense 0.5B is **50%**"
        in page
    )
    assert "(25.00 against 30.00; target ≥ 50%)" in page and "30.0 tokens/s against the 0.5B's 40.0 (0.75×)" in page
    line = family_page.family_line(_data()["cells"])
    assert f"{100 * (25.0 / line(30.0) - 1):+.0f}% |" in page
    assert "peak RSS 2.00 GB" in page and "took 10.0 min against an estimate of 8.3 min" in page
    assert "Not measured yet" not in page


def test_without_pruned_points_the_page_says_so_and_the_claims_read_the_dense_cells():
    data = _data()
    page = family_page.render(data)
    assert "**Not measured yet: the pruned 1.5B.**" in page and "(2.50× lower)" in page
    assert family_page.claim(data, "1.5B dense", "served") == "12.00 / 30.00"
    assert family_page.claim(data, "1.5B dense", "speed") == "20.0 / 40.0 tokens/s"
    svg = family_page.svg(data["cells"])
    assert svg.count("<circle") == 2 and "1.5B dense (12.0)" in svg
