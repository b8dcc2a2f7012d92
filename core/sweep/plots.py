"""Result plots for sweeps, written as PNG files with matplotlib's Agg renderer.

The functions take plain data (no sweep objects), so they serve any caller:

- :func:`metric_vs_ratio` — one line per reconstruction method, metric against pruning ratio, the dense
  model as a dashed horizontal line; log-scale y for perplexity (the paper's Figures 3–4).
- :func:`layer_errors` — relative output error of each pruned projection against the layer index, one
  panel for attention and one for the FFN, one line per method (the paper's Figure 5a).

Figures are built with :class:`matplotlib.figure.Figure` and never touch ``pyplot``'s global state or
the process-wide backend, so plotting is safe inside a web server or a worker thread.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
_MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")


def _figure(width: float, height: float, ncols: int = 1):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(width, height), layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(1, ncols, squeeze=False)[0]
    return fig, list(axes)


def _save(fig, path: str | Path) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    fig.savefig(tmp, format="png", dpi=120)
    tmp.replace(path)
    return path


def _positive(values: Sequence[float]) -> bool:
    return bool(values) and all(v > 0 and math.isfinite(v) for v in values)


def _log_y(ax, values: Sequence[float]) -> None:
    """Log-scale y axis with plain numbers; minor ticks labelled only when the data span under a decade."""
    from matplotlib.ticker import FuncFormatter, NullFormatter

    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _pos: f"{v:.3g}")
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain if max(values) / min(values) < 10 else NullFormatter())


def _integer_x(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def metric_vs_ratio(
    series: Mapping[str, Sequence[tuple[float, float]]],
    path: str | Path,
    *,
    metric: str,
    title: str = "",
    dense: float | None = None,
    log_y: bool | None = None,
) -> Path:
    """Plot ``series[method] = [(ratio, value), ...]`` and save a PNG at ``path``.

    ``log_y`` defaults to True for perplexity-like metrics (name containing "perplexity" or "ppl")
    when every value is positive. Non-finite values (a diverged run) are left out of the line.
    """
    fig, (ax,) = _figure(6.0, 4.2)
    values: list[float] = []
    for i, (label, points) in enumerate(series.items()):
        pts = sorted((r, v) for r, v in points if v is not None and math.isfinite(v))
        if not pts:
            continue
        xs, ys = [100 * r for r, _ in pts], [v for _, v in pts]
        values += ys
        ax.plot(xs, ys, marker=_MARKERS[i % len(_MARKERS)], label=label)
    if dense is not None and math.isfinite(dense):
        values.append(dense)
        ax.axhline(dense, color="black", linestyle="--", linewidth=1, label="dense")
    if log_y is None:
        log_y = any(k in metric.lower() for k in ("perplexity", "ppl"))
    if log_y and _positive(values):
        _log_y(ax, values)
    ax.set_xlabel("parameters removed from the transformer blocks (%)")
    ax.set_ylabel(metric + (" (log scale)" if ax.get_yscale() == "log" else ""))
    if title:
        ax.set_title(title, fontsize=10)
    ax.grid(True, which="major", alpha=0.3)
    if series or dense is not None:
        ax.legend(fontsize=8)
    return _save(fig, path)


def layer_errors(
    series: Mapping[str, Mapping[str, Sequence[tuple[int, float]]]],
    path: str | Path,
    *,
    title: str = "",
    modules: Sequence[str] = ("attention", "ffn"),
) -> Path:
    """Plot ``series[label][module] = [(layer, relative_error), ...]``: one panel per module.

    The y axis is logarithmic when every plotted error is positive.
    """
    names = {"attention": "attention (o_proj)", "ffn": "FFN (down_proj)"}
    fig, axes = _figure(5.0 * len(modules), 4.0, ncols=len(modules))
    for ax, module in zip(axes, modules):
        values: list[float] = []
        for i, (label, per_module) in enumerate(series.items()):
            pts = sorted((layer, e) for layer, e in per_module.get(module, ()) if e is not None and math.isfinite(e))
            if not pts:
                continue
            values += [e for _, e in pts]
            style = "--" if label.startswith("no reconstruction") else "-"
            ax.plot(
                [layer for layer, _ in pts],
                [e for _, e in pts],
                linestyle=style,
                marker=_MARKERS[i % len(_MARKERS)],
                markersize=3,
                label=label,
            )
        if _positive(values):
            _log_y(ax, values)
        _integer_x(ax)
        ax.set_title(names.get(module, module), fontsize=10)
        ax.set_xlabel("layer")
        ax.set_ylabel("relative output error")
        ax.grid(True, alpha=0.3)
        if values:
            ax.legend(fontsize=8)
    if title:
        fig.suptitle(title, fontsize=10)
    return _save(fig, path)


def is_png(path: str | Path) -> bool:
    """True when ``path`` is a non-empty file starting with the PNG signature."""
    path = Path(path)
    if not path.is_file() or path.stat().st_size <= len(PNG_SIGNATURE):
        return False
    with path.open("rb") as fh:
        return fh.read(len(PNG_SIGNATURE)) == PNG_SIGNATURE
