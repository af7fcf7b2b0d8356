"""Plotly figures of corpus mode: a statistic's grid with its spread and the pattern types (both through
``layer_head_figure``, the app's one layer x head builder), the query-key scatter and its layer grid, and the
nearest contexts' words and their trend over the layers. Figure builders only (no streamlit).
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from model_core.corpus import PATTERN_TYPES
from attention_explorer.figures import layer_head_figure

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


QUERY_COLOUR, KEY_COLOUR = "#4c78a8", "#e45756"


def qk_scatter_figure(coords: np.ndarray, is_key: np.ndarray, hover: list[str], colour: np.ndarray | None, title: str,
                      *, colour_title: str = "", height: int = 620) -> go.Figure:
    """The joint query–key scatter (WebGL): queries as circles (trace 0), keys as crosses (trace 1).

    A click reports the trace and the point's index within it; ``scatter_point_rows`` maps them back to rows
    of ``coords``. Nothing per point travels but the coordinates (float32), the hover text and the colour.

    Shape: coords (points, 2); is_key (points,); colour (points,) numbers, or None to colour by query/key.
    """
    fig = go.Figure()
    hover = np.asarray(hover, dtype=object)
    for key, name, symbol in ((False, "queries", "circle"), (True, "keys", "x")):
        sel = is_key == key
        marker: dict = {"size": 4, "symbol": symbol, "opacity": 0.7}
        if colour is None:
            marker["color"] = KEY_COLOUR if key else QUERY_COLOUR
        else:
            marker |= {"color": np.asarray(colour[sel], dtype=np.float32), "colorscale": "Viridis",
                       "showscale": not key, "colorbar": {"title": colour_title}}
        fig.add_trace(go.Scattergl(
            x=coords[sel, 0].astype(np.float32), y=coords[sel, 1].astype(np.float32), mode="markers", name=name,
            marker=marker, hovertext=hover[sel].tolist(), hovertemplate=f"{name[:-1]} · %{{hovertext}}<extra></extra>"))
    fig.update_layout(title=title, height=height, template="plotly_white", clickmode="event+select", dragmode="pan",
                      margin={"l": 40, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h", "y": -0.05})
    fig.update_xaxes(showticklabels=False, zeroline=False)
    fig.update_yaxes(showticklabels=False, zeroline=False, scaleanchor="x")
    return fig


def scatter_point_row(is_key: np.ndarray, curve: int, index: int) -> int:
    """The row of ``coords`` that ``qk_scatter_figure`` drew as point ``index`` of trace ``curve``."""
    rows = np.flatnonzero(is_key == bool(curve))
    if not 0 <= index < len(rows):
        raise ValueError(f"Point {index} is not in trace {curve}.")
    return int(rows[index])


def qk_grid_figure(projections: list[np.ndarray], is_key: list[np.ndarray], layer: int, *, cols: int = 4) -> go.Figure:
    """Small joint projections of every head of a layer: a picture to spot structured heads (hover names the head).

    Clicking a panel reports a point of trace ``2 * head`` (queries) or ``2 * head + 1`` (keys).
    """
    from plotly.subplots import make_subplots

    n = len(projections)
    rows = (n + cols - 1) // cols
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=[f"head {h}" for h in range(n)],
                        horizontal_spacing=0.02, vertical_spacing=0.06)
    for head, (coords, keys) in enumerate(zip(projections, is_key)):
        r, c = head // cols + 1, head % cols + 1
        for key, colour in ((False, QUERY_COLOUR), (True, KEY_COLOUR)):
            sel = keys == key
            fig.add_trace(go.Scattergl(x=coords[sel, 0].astype(np.float32), y=coords[sel, 1].astype(np.float32),
                                       mode="markers", showlegend=False, name=f"head {head}",
                                       marker={"size": 2, "color": colour, "opacity": 0.5},
                                       # "skip" would also stop the click reaching Streamlit
                                       hovertemplate=f"head {head}<extra>click to enlarge</extra>"), row=r, col=c)
    fig.update_xaxes(showticklabels=False, zeroline=False, showgrid=False)
    fig.update_yaxes(showticklabels=False, zeroline=False, showgrid=False)
    fig.update_layout(title=f"Layer {layer}: every head (blue queries, red keys); click one to enlarge it",
                      height=min(190 * rows + 60, 1000), template="plotly_white", dragmode=False,
                      clickmode="event+select", margin={"l": 10, "r": 10, "t": 60, "b": 10})
    return fig


def neighbour_words_figure(words: list[str], title: str) -> go.Figure:
    """How many of the nearest contexts are each word (most first)."""
    labels, counts = np.unique(np.asarray(words, dtype=object), return_counts=True) if words else ([], [])
    order = np.argsort(-np.asarray(counts), kind="stable")
    fig = go.Figure(go.Bar(x=[counts[i] for i in order], y=[labels[i] for i in order], orientation="h",
                           marker_color=QUERY_COLOUR, hovertemplate="%{y}: %{x}<extra></extra>"))
    fig.update_yaxes(autorange="reversed", type="category")
    fig.update_xaxes(title="neighbours", dtick=1)
    fig.update_layout(title=title, height=min(max(220, 26 * len(labels) + 100), 700), template="plotly_white",
                      margin={"l": 110, "r": 20, "t": 50, "b": 40})
    return fig


def layer_trend_figure(same_word: np.ndarray, mean_score: np.ndarray, word: str) -> go.Figure:
    """Per layer (0 = embeddings): the share of neighbours that are the same word, and their mean cosine."""
    layers = list(range(len(same_word)))
    fig = go.Figure([
        go.Scatter(x=layers, y=same_word, mode="lines+markers", name=f"share that are '{word}'"),
        go.Scatter(x=layers, y=mean_score, mode="lines+markers", name="mean cosine"),
    ])
    fig.update_xaxes(title="layer (0 = embeddings)", dtick=1)
    fig.update_yaxes(range=[0, 1.05])
    fig.update_layout(title="From layer 0 up", height=340, template="plotly_white",
                      margin={"l": 40, "r": 20, "t": 50, "b": 40}, legend={"orientation": "h", "y": -0.25})
    return fig
