"""Plotly figures of a corpus run: the statistic grid with its spread, and the pattern types.

Figure builders only (no streamlit): both reuse ``layer_head_figure``, the app's one layer x head builder.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from model_core.corpus import PATTERN_TYPES
from ui.analysis_figures import layer_head_figure

PATTERN_COLOURS = {"vertical": "#4c78a8", "diagonal": "#f58518", "block": "#54a24b", "heterogeneous": "#d3d3d3"}


def corpus_stat_figure(mean: np.ndarray, std: np.ndarray, count: np.ndarray, patterns: np.ndarray, title: str, *,
                       show: str = "mean", zmax: float | None = None, colorbar: str = "") -> go.Figure:
    """The corpus mean (or std) of one statistic per head; the hover gives mean ± std, the texts and the type.

    Shape: mean, std, count, patterns (layer, head).
    """
    if show not in ("mean", "std"):
        raise ValueError(f"show must be 'mean' or 'std', not {show!r}.")
    grid = mean if show == "mean" else std
    fig = layer_head_figure(grid, title, zmin=0.0, zmax=zmax, colorbar=colorbar, clickable=True)
    finite = np.isfinite(np.asarray(grid, dtype=float).ravel())
    extra = np.stack([mean.ravel(), std.ravel(), count.ravel(), patterns.ravel()], axis=-1)[finite]
    fig.data[1].customdata = extra
    fig.data[1].hovertemplate = ("layer %{y}, head %{x}<br>mean %{customdata[0]:.4f} ± %{customdata[1]:.4f} (std)"
                                 "<br>over %{customdata[2]} texts · %{customdata[3]}<extra>click for its texts</extra>")
    return fig


def pattern_figure(patterns: np.ndarray, title: str = "Pattern type (heuristic)") -> go.Figure:
    """One colour per pattern type, its initial in each cell. Shape: patterns (layer, head) str."""
    codes = np.vectorize(PATTERN_TYPES.index)(patterns).astype(float)
    n = len(PATTERN_TYPES)
    # A stepped colour scale: code k fills [k/n, (k+1)/n] with its own colour.
    scale = []
    for k, name in enumerate(PATTERN_TYPES):
        scale += [[k / n, PATTERN_COLOURS[name]], [(k + 1) / n, PATTERN_COLOURS[name]]]
    fig = layer_head_figure(codes, title, colorscale=scale, zmin=-0.5, zmax=n - 0.5, clickable=True)
    heat = fig.data[0]
    heat.text = np.vectorize(lambda p: p[0].upper())(patterns)
    heat.texttemplate = "%{text}"
    heat.colorbar = {"title": "", "tickvals": list(range(n)), "ticktext": list(PATTERN_TYPES)}
    fig.data[1].customdata = patterns.ravel()
    fig.data[1].hovertemplate = "layer %{y}, head %{x}<br>%{customdata}<extra>click for its texts</extra>"
    return fig
