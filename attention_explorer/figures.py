"""Plotly figure builders for the attention pages (data in, figure out; no streamlit)."""

from __future__ import annotations

import html
import textwrap

import numpy as np
import plotly.graph_objects as go

from attention_explorer.head_grids import HeadGrid, layer_head_figure, layer_head_grids  # noqa: F401 (re-exported)
from attention_explorer.reply_marks import mark_reply, mark_reply_on_tokens
from model_core.analysis.aggregate import pool_matrix

WEIGHT_SCALE = "Blues"
SCORE_SCALE = "RdBu_r"
MASKED_COLOR = "#3b3b3b"
MASKED_WEIGHT_COLOR = "#d9d9d9"  # cells a mask forbids, in a weights heatmap: the plot background shows through
MAX_TICKS = 64
# Above this many tokens a heatmap's margins are fixed from its longest tick label instead of measured
# by Plotly (automargin lays the figure out twice: about 70 ms of a 512-token redraw in the browser; the
# causal page's 128-token windows, six figures, took 0.51-0.66 s a head change with it and 0.40-0.43 s without).
FIXED_MARGIN_TOKENS = 64
COLORBAR_TITLE_CHARS = 12  # a longer colour-bar title wraps, so it does not take the width of the plot
TICK_CHAR_PX = 6.5  # width of one character of a 10 px tick label, a little generous
FIGURE_FORMATS = ("png", "svg")
"""What the camera button of a figure's toolbar can download (in the browser, with no server round trip)."""


def plotly_config(filename: str, fmt: str = "png") -> dict:
    """The modebar configuration that makes the camera button download ``filename``.png or .svg.

    Raises:
        ValueError: ``fmt`` is not one of ``FIGURE_FORMATS``.
    """
    if fmt not in FIGURE_FORMATS:
        raise ValueError(f"fmt must be one of {FIGURE_FORMATS}, not {fmt!r}.")
    safe = "".join(c if c.isalnum() or c in "-_." else "_" for c in filename).strip("_") or "figure"
    return {
        "displaylogo": False,
        "toImageButtonOptions": {"format": fmt, "filename": safe, "scale": 2 if fmt == "png" else 1},
    }


def token_label(token: str) -> str:
    """A token as plain text for Plotly, which would otherwise read some tags in labels and hovers."""
    return html.escape(token, quote=False)


def category_ticks(labels: list[str], max_ticks: int = MAX_TICKS) -> dict:
    """Ticks for an axis of ``token_labels`` ("i: token"): at most ``max_ticks`` of them, each showing its token."""
    step = max(1, int(np.ceil(len(labels) / max_ticks)))
    shown = labels[::step]
    return dict(type="category", tickmode="array", tickvals=shown,
                ticktext=[label.split(": ", 1)[-1] for label in shown], tickfont=dict(size=10))


def attention_heatmap(
    matrix: np.ndarray,
    tokens: tuple[str, ...],
    *,
    title: str = "",
    sentence_b_start: int | None = None,
    hide: list[int] | tuple[int, ...] = (),
    colorscale: str = WEIGHT_SCALE,
    zmin: float | None = 0.0,
    zmax: float | None = None,
    value_name: str = "weight",
    height: int | None = None,
    masked: np.ndarray | None = None,
    key_tokens: tuple[str, ...] | None = None,
    first: tuple[int, int] = (0, 0),
    pool: int = 1,
    reply_start: int | None = None,
) -> go.Figure:
    """The app's one query x key heatmap: tokens on both axes and the exact value on hover.

    Cells that are -inf (masked scores) are drawn as dark hatched cells labelled -inf, never as a
    colour of the scale. ``hide`` drops those positions (e.g. [CLS]/[SEP]) without renormalising.
    ``masked`` (True where the model's mask forbids a query to see a key, e.g. a decoder's causal
    triangle) leaves those cells out in light grey, apart from the weights that are merely small;
    it costs no extra data (the cells are gaps that show the plot's background).

    A window of a long input: ``tokens`` are its queries', ``key_tokens`` its keys' (when they differ), and
    ``first`` the positions of its first query and key, so the labels read "position: token". A long input
    pooled: ``matrix`` holds block means of ``pool`` positions a side over ``tokens``, and the axes show token
    positions (a cell centred on its block), so a box drawn on it reads positions.

    ``reply_start`` (a generated sequence's first reply token, ``AttentionTrace.reply_start``) draws a dashed teal
    line on both axes before it, as sentence B's start is drawn dotted orange.

    Shape: matrix (q_pos, k_pos), or (ceil(pos / pool),) * 2 pooled; masked as matrix, bool.
    """
    if pool > 1:
        fig = _pooled_heatmap(matrix, len(tokens), pool, title=title, colorscale=colorscale, zmin=zmin, zmax=zmax,
                              value_name=value_name, height=height)
        if reply_start is not None and 0 < reply_start < len(tokens):
            mark_reply(fig, x=reply_start - 0.5, y=reply_start - 0.5)
        return fig
    hidden = set(hide) if key_tokens is None else set()  # ``hide`` drops positions of a square matrix only
    keys = tokens if key_tokens is None else key_tokens
    rows = np.array([i for i in range(len(tokens)) if i not in hidden], dtype=int)
    cols = np.array([i for i in range(len(keys)) if i not in hidden], dtype=int)
    z = np.asarray(matrix, dtype=np.float64)[np.ix_(rows, cols)]
    neg_inf = np.isneginf(z)
    # float32 goes to the browser as a base64 typed array (4 bytes a cell) rather than JSON text.
    shown = np.round(np.where(neg_inf, np.nan, z), 5).astype(np.float32)
    gaps = (np.zeros_like(neg_inf) if masked is None
            else np.asarray(masked, dtype=bool)[np.ix_(rows, cols)] & ~neg_inf)
    if gaps.any():
        shown[gaps] = np.nan
    y_every, x_every = token_labels(tokens, first[0]), token_labels(keys, first[1])
    y_labels, x_labels = [y_every[i] for i in rows], [x_every[j] for j in cols]
    n = max(len(rows), len(cols))
    # An explicit colour range: Plotly would otherwise scan all n * n values for it on every redraw.
    zmin, zmax = _colour_range(shown, zmin, zmax)
    colorbar_lines = textwrap.wrap(value_name, COLORBAR_TITLE_CHARS) or [""]
    # The axes are categories named "i: token", so the hover reads the exact labels from x and y:
    # no (n, n, 2) customdata of strings, which at 512 tokens was 9 MB of JSON.
    fig = go.Figure(go.Heatmap(
        z=shown, x=x_labels, y=y_labels, colorscale=colorscale, zmin=zmin, zmax=zmax,
        hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{value_name} %{{z:.4f}}<extra></extra>",
        colorbar=dict(title=dict(text="<br>".join(colorbar_lines)), thickness=12), hoverongaps=False,
    ))
    if neg_inf.any():
        # A separate grey layer, so -inf can never be read as a value of the colour scale.
        fig.add_trace(go.Heatmap(
            z=np.where(neg_inf, 1.0, np.nan).astype(np.float32), x=x_labels, y=y_labels,
            colorscale=[[0, MASKED_COLOR], [1, MASKED_COLOR]],
            showscale=False, hoverongaps=False, name="-inf (masked)",
            text=np.where(neg_inf, "−∞", "") if n <= 24 else None,
            texttemplate="%{text}" if n <= 24 else None, textfont=dict(color="white", size=10),
            hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{value_name} -inf (masked)<extra></extra>",
        ))
    if sentence_b_start is not None and sentence_b_start not in hidden and key_tokens is None:
        b = int(np.searchsorted(rows, sentence_b_start)) - 0.5
        m = len(rows)
        for shape in (dict(x0=b, x1=b, y0=-0.5, y1=m - 0.5), dict(y0=b, y1=b, x0=-0.5, x1=m - 0.5)):
            fig.add_shape(type="line", line=dict(color="#e4572e", width=2, dash="dot"), **shape)
    mark_reply_on_tokens(fig, reply_start, rows + first[0], cols + first[1])
    height = height or min(760, 260 + 14 * n)
    # One tick label per ~12 px of the plot's height (the plot is about square), at most MAX_TICKS.
    max_ticks = int(np.clip((height - 150) // 12, 8, MAX_TICKS))
    x_ticks, y_ticks = category_ticks(x_labels, max_ticks), category_ticks(y_labels, max_ticks)
    margin = dict(l=10, r=10, t=40 if title else 10, b=10)
    if n > FIXED_MARGIN_TOKENS:
        # Fixed room for the longest shown label (x labels stand upright), so Plotly lays out once.
        x_px, y_px = (int(TICK_CHAR_PX * max(len(html.unescape(t)) for t in ticks["ticktext"])) + 8
                      for ticks in (x_ticks, y_ticks))
        x_ticks.update(tickangle=-90, automargin=False)
        y_ticks.update(automargin=False)
        colorbar_px = max(90, 40 + int(TICK_CHAR_PX * 1.2 * max(map(len, colorbar_lines))))  # its title is 12 px
        margin = dict(l=y_px + 28, r=colorbar_px, t=x_px + 28 + (30 if title else 0), b=10, autoexpand=False)
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), height=height,
        margin=margin, plot_bgcolor=MASKED_WEIGHT_COLOR if gaps.any() else "white",
        legend=dict(orientation="h", y=-0.12),
        xaxis=dict(title="key (attended to)", side="top", showgrid=False, zeroline=False, **x_ticks),
        yaxis=dict(title="query (attending)", autorange="reversed", showgrid=False, zeroline=False, **y_ticks),
    )
    return fig


def _colour_range(shown: np.ndarray, zmin: float | None, zmax: float | None) -> tuple[float, float]:
    """The colour range: the given ends, else the finite values' least and largest."""
    finite = shown[np.isfinite(shown)]
    if zmin is None:
        zmin = float(finite.min()) if finite.size else 0.0
    if zmax is None:
        zmax = float(finite.max()) if finite.size else 1.0
    return zmin, zmax


def _pooled_heatmap(cells: np.ndarray, n_tokens: int, pool: int, *, title: str, colorscale: str,
                    zmin: float | None, zmax: float | None, value_name: str, height: int | None) -> go.Figure:
    """``attention_heatmap`` of block means, ``pool`` positions a side, on position axes. Shape: cells (m, m)."""
    starts = np.arange(cells.shape[0]) * pool
    centres = (starts + np.minimum(starts + pool, n_tokens) - 1) / 2  # the last block may be shorter
    shown = np.round(cells, 5).astype(np.float32)
    zmin, zmax = _colour_range(shown, zmin, zmax)
    fig = go.Figure(go.Heatmap(
        z=shown, x=centres, y=centres, colorscale=colorscale, zmin=zmin, zmax=zmax or 1.0,
        colorbar=dict(thickness=10, title=dict(text=value_name)),
        hovertemplate=f"queries around %{{y:.0f}}<br>keys around %{{x:.0f}}<br>{value_name} %{{z:.4f}}<extra></extra>",
    ))
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), height=height or 640, margin=dict(l=60, r=20, t=60, b=20),
        xaxis=dict(title="key position", side="top", range=[-0.5, n_tokens - 0.5], showgrid=False),
        yaxis=dict(title="query position", autorange="reversed", showgrid=False, scaleanchor="x"),
    )
    return fig


def head_mosaic(attentions: np.ndarray, max_cells: int = 32) -> np.ndarray:
    """Every head block-pooled to m x m (m = min(pos, max_cells)), laid out with one NaN cell between heads.

    Keys are summed, so each pooled row still sums to 1 and a head that attends within its block shows as
    dark as it is, not diluted by the block's width. The app caches it per trace (``ui.derived``).

    Shape: attentions (layer, head, q_pos, k_pos) -> (layer * (m + 1) - 1, head * (m + 1) - 1).
    """
    n_layers, n_heads, n, _ = attentions.shape
    m = min(n, max_cells)
    step = m + 1
    mosaic = np.full((n_layers * step - 1, n_heads * step - 1), np.nan, dtype=np.float32)
    pooled = pool_matrix(attentions, m, sum_keys=True)  # every head at once: (layer, head, m, m)
    for layer in range(n_layers):
        for head in range(n_heads):
            r, c = layer * step, head * step
            mosaic[r:r + m, c:c + m] = pooled[layer, head]
    return mosaic


OVERVIEW_MAX_PX = 900
"""The tallest the overview mosaic grows."""


def overview_cells(n_layers: int, n_tokens: int, most: int = 32) -> int:
    """Cells per head side in the overview: every token up to ``most`` of them (exact); past that, pooled to at most
    ``most`` cells, and no more than its ``OVERVIEW_MAX_PX`` show at 2 px a cell: 32 up to 12 layers, 12 for
    SmolLM2's 30 (at 32 a cell was 0.8 px tall, and the mosaic 1.8 MB of the page's 3.4 MB at 512 tokens, drawn
    at the same size)."""
    if n_tokens <= most:
        return n_tokens
    return max(8, min(most, (OVERVIEW_MAX_PX - 80) // (2 * n_layers) - 1))


def overview_mosaic(attentions: np.ndarray, *, max_cells: int | None = None,
                    mosaic: np.ndarray | None = None) -> go.Figure:
    """All layers x heads as small multiples in ONE Plotly heatmap (fast at any length).

    Each head is pooled to at most ``max_cells`` squared cells (``overview_cells`` of the layer count when None;
    queries averaged, keys summed: a cell is the share of attention a block of queries gives a block of keys); a
    one-cell gap separates heads. Clicking a head reports (layer, head) through the invisible marker on its centre.
    ``mosaic`` is ``head_mosaic(attentions, max_cells)`` when the caller has it cached.

    Shape: attentions (layer, head, q_pos, k_pos).
    """
    n_layers, n_heads, n, _ = attentions.shape
    max_cells = overview_cells(n_layers, n) if max_cells is None else max_cells
    m = min(n, max_cells)
    step = m + 1
    mosaic = head_mosaic(attentions, max_cells) if mosaic is None else mosaic
    # Cell coordinates in head (x) and layer (y) units: head h's cells lie within h ± 0.47, so the
    # hover reads layer and head as %{y:.0f} and %{x:.0f}, with no per-cell customdata to send.
    offset = (m - 1) / 2
    xs = (np.arange(mosaic.shape[1]) - offset) / step
    ys = (np.arange(mosaic.shape[0]) - offset) / step
    value = "share" if m < n else "weight"
    fig = go.Figure(go.Heatmap(
        z=np.round(mosaic, 3), x=xs, y=ys, colorscale=WEIGHT_SCALE, zmin=0, zmax=1, showscale=True,
        hovertemplate=f"layer %{{y:.0f}}, head %{{x:.0f}}<br>{value} %{{z:.3f}}<extra></extra>",
        hoverongaps=False, colorbar=dict(thickness=10, title=dict(text=value)),
    ))
    centers_x = list(range(n_heads))
    centers_y = list(range(n_layers))
    cell_px = max(2, min(10, 900 // (n_heads * step)))
    # A heatmap alone reports no point selection to Streamlit; an invisible square marker on each
    # head's centre does, so a click on a thumbnail focuses that head.
    layers, heads = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    fig.add_trace(go.Scatter(
        x=np.asarray(centers_x)[heads.ravel()], y=np.asarray(centers_y)[layers.ravel()], mode="markers",
        marker=dict(symbol="square", size=max(10, int(m * cell_px * 0.8)), color="rgba(0,0,0,0)"),
        customdata=np.stack([layers.ravel(), heads.ravel()], -1),
        hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<extra>click to focus</extra>",
        showlegend=False))
    fig.update_layout(
        clickmode="event+select", dragmode=False,
        height=min(OVERVIEW_MAX_PX, 80 + n_layers * step * cell_px), margin=dict(l=10, r=10, t=30, b=10), plot_bgcolor="white",
        xaxis=dict(tickmode="array", tickvals=centers_x, ticktext=[f"H{h}" for h in range(n_heads)], side="top",
                   showgrid=False, zeroline=False),
        yaxis=dict(tickmode="array", tickvals=centers_y, ticktext=[f"L{i}" for i in range(n_layers)],
                   autorange="reversed", showgrid=False, zeroline=False, scaleanchor="x"),
    )
    return fig


def token_labels(tokens: tuple[str, ...] | list[str], start: int = 0) -> list[str]:
    """Unique category labels "i: token", counting from ``start`` (repeated words stay apart; hovers read the label
    from the axis)."""
    return [f"{i}: {token_label(t)}" for i, t in enumerate(tokens, start)]


def vector_heatmap(matrix: np.ndarray, tokens: tuple[str, ...], *, title: str, colorscale: str = SCORE_SCALE,
                   x_title: str = "dimension", max_dims: int = 128, reply_start: int | None = None) -> go.Figure:
    """Rows are tokens, columns are vector dimensions (the first ``max_dims``). Shape: (pos, dim).

    Like ``attention_heatmap`` at any length: float32 z (a typed array), the token read on hover from the
    category axis (no per-cell strings), thinned ticks, a height that stops at 600 px.
    """
    m = np.asarray(matrix, dtype=np.float32)[:, :max_dims]
    limit = float(np.abs(m).max()) or 1.0
    labels = token_labels(tokens)
    height = min(600, 140 + 16 * len(tokens))
    fig = go.Figure(go.Heatmap(z=m, y=labels, colorscale=colorscale, zmin=-limit, zmax=limit,
                               hovertemplate="%{y}<br>dim %{x}: %{z:.4f}<extra></extra>",
                               colorbar=dict(thickness=10)))
    fig.update_layout(title=dict(text=title, font=dict(size=13)), height=height,
                      margin=dict(l=10, r=10, t=36, b=10),
                      xaxis=dict(title=x_title),
                      yaxis=dict(autorange="reversed",
                                 **category_ticks(labels, int(np.clip((height - 80) // 12, 8, MAX_TICKS)))))
    mark_reply_on_tokens(fig, reply_start, np.arange(len(tokens)), None)
    return fig


def token_norms_figure(tokens: tuple[str, ...], series: dict[str, np.ndarray], title: str,
                       reply_start: int | None = None) -> go.Figure:
    """One line per series (label -> one number per token), e.g. each token's vector norm at a step.

    Shape: each series (pos,).
    """
    labels = token_labels(tokens)
    fig = go.Figure()
    for label, values in series.items():
        fig.add_trace(go.Scatter(x=labels, y=np.asarray(values, dtype=np.float32), mode="lines+markers", name=label,
                                 hovertemplate="%{x}<br>‖·‖ = %{y:.3f}<extra>" + label + "</extra>"))
    fig.update_layout(title=dict(text=title, font=dict(size=13)), height=320, margin=dict(l=10, r=10, t=36, b=10),
                      yaxis=dict(title="L2 norm", rangemode="tozero"), legend=dict(orientation="h", y=-0.3),
                      xaxis=dict(tickangle=-45 if len(tokens) > 12 else 0, **category_ticks(labels)))
    mark_reply_on_tokens(fig, reply_start, None, np.arange(len(tokens)))
    return fig


def selection_grid(values: np.ndarray, tokens: tuple[str, ...], *, title: str, value_name: str,
                   reply_start: int | None = None) -> go.Figure:
    """Every layer x head as one row, every token as a column: what a selection of tokens sends or receives.

    Typed-array z, the token read from the category axis on hover, thinned ticks, at most 1,000 px tall.

    Shape: values (layer, head, pos).
    """
    n_layers, n_heads, n = values.shape
    labels = token_labels(tokens)
    rows = [f"L{layer} H{head}" for layer in range(n_layers) for head in range(n_heads)]
    height = int(np.clip(120 + 7 * len(rows), 300, 1000))
    fig = go.Figure(go.Heatmap(
        z=np.asarray(values, dtype=np.float32).reshape(-1, n), x=labels, y=rows, colorscale=WEIGHT_SCALE, zmin=0,
        zmax=float(np.nanmax(values)) if values.size else 1.0,
        hovertemplate=f"%{{y}}<br>token %{{x}}<br>{value_name} %{{z:.4f}}<extra></extra>",
        colorbar=dict(title=dict(text=value_name), thickness=12)))
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=height, plot_bgcolor="white",
                      margin=dict(l=10, r=10, t=40, b=10),
                      xaxis=dict(side="top", tickangle=-90 if n > 24 else 0, **category_ticks(labels)),
                      yaxis=dict(autorange="reversed", **category_ticks(rows, int(np.clip((height - 120) // 12, 8,
                                                                                        MAX_TICKS)))))
    mark_reply_on_tokens(fig, reply_start, None, np.arange(n))
    return fig
