"""The Model page's chart of a job's exports (``app.web.export_chart``): the points read from the export
jobs' metrics, the reference point, the caption, and the sentence in place of an empty chart."""

from __future__ import annotations

from app.web import export_chart, figures
from jobs import export_quality as q

REFERENCE = {q.REFERENCE_PERPLEXITY: 20.5, q.REFERENCE_BYTES: 4_000_000}
WINDOWS = {q.EVAL_WINDOWS: 32, q.EVAL_TOTAL: 80, q.EVAL_SEQ_LEN: 512}


def _export(job_id: int, status: str, forms: list[str], rows: dict, **metrics) -> dict:
    flat = {q.metric(form, name): value for form, row in rows.items() for name, value in row.items()}
    return {"id": job_id, "status": status, "forms": forms, "metrics": {**flat, **metrics}}


def test_the_points_are_the_measured_gguf_files_by_size_with_the_checkpoint_as_reference():
    exports = [
        _export(
            5,
            "SUCCEEDED",
            ["gguf-f16", "vllm"],
            {"gguf-f16": {"bytes": 2_000_000, "perplexity": 20.6, "fallbacks": 0}, "vllm": {"bytes": 4_100_000}},
            **REFERENCE,
            **WINDOWS,
        ),
        _export(6, "FAILED", ["gguf-q8_0"], {"gguf-q8_0": {"bytes": 1_100_000, "perplexity": 99.0}}),
        _export(
            7, "SUCCEEDED", ["gguf-q4_k_m"], {"gguf-q4_k_m": {"bytes": 700_000, "perplexity": 22.0, "fallbacks": 14}}
        ),
        _export(8, "SUCCEEDED", ["gguf-iq2_m"], {"gguf-iq2_m": {"bytes": 500_000}}),  # scoring failed: no point
    ]
    data = export_chart.chart_data(3, exports)
    assert [(p["form"], p["job"], p["size"], p["value"], p["fallbacks"]) for p in data.points] == [
        ("gguf-q4_k_m", 7, 700_000, 22.0, 14),
        ("gguf-f16", 5, 2_000_000, 20.6, 0),
    ]
    assert data.points[0]["quant"] == "q4_k_m" and data.points[0]["href"] == "?job=7"
    assert data.reference == {"size": 4_000_000, "value": 20.5, "label": "job 3 (unquantized)", "mib": 3.81}
    assert (data.windows, data.total, data.seq_len) == (32, 80, 512)
    spec = export_chart.spec(data)
    assert spec["data"]["values"] == data.points
    assert spec["layer"][0]["encoding"]["x"]["scale"] == {"type": "log"}
    diamond = spec["layer"][2]
    assert diamond["mark"]["shape"] == "diamond" and diamond["data"]["values"] == [data.reference]
    assert export_chart.caption(data, "wikitext2") == (
        "Each GGUF export's perplexity in llama.cpp on the first 32 of the job's 80 windows of 512 tokens of "
        "wikitext2, against its file size; ◆ job 3's own checkpoint (unquantized, torch) on the same windows."
    )


def test_without_a_measured_export_the_chart_says_why():
    no_text = export_chart.chart_data(3, [_export(5, "SUCCEEDED", ["gguf-f16"], {"gguf-f16": {"bytes": 9}})])
    assert export_chart.spec(no_text) is None
    exports = [_export(5, "SUCCEEDED", ["gguf-f16"], {"gguf-f16": {"bytes": 9}})]
    assert export_chart.reason(no_text, exports, evaluated=False) == (
        "Job 3 names no evaluation text (it ran no perplexity evaluation), so its exports' held-out perplexity "
        "is not measured."
    )
    assert export_chart.reason(no_text, [{**exports[0], "status": "RUNNING"}], evaluated=True) == (
        "No export of this checkpoint has finished yet."
    )
    vllm = [_export(5, "SUCCEEDED", ["vllm"], {"vllm": {"bytes": 9}})]
    assert export_chart.reason(no_text, vllm, evaluated=True).startswith("Only the vLLM form was exported")
    assert export_chart.reason(no_text, exports, evaluated=True).startswith("No finished GGUF export has a measured")


def test_an_exports_row_reads_as_words():
    assert q.form_rows({"export.gguf-q4_k_m.perplexity": 3.0, "export_bytes": 9, "export.x.other": 1}) == {
        "gguf-q4_k_m": {"perplexity": 3.0}
    }
    assert figures.metric_name("export.gguf-q4_k_m.perplexity") == "gguf-q4_k_m: held-out perplexity (llama.cpp)"
    assert figures.metric_name("export.gguf-q4_k_m.fallbacks") == "gguf-q4_k_m: tensors fallen back from its K/i type"
