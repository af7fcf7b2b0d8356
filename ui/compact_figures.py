"""Figures of a compact trace (``model_core.compact.trace``): one head pooled at full extent with numeric position axes
(so a box selection reads positions), an exact rectangular window with token labels, and the first-token share."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attention_explorer.figures import MASKED_WEIGHT_COLOR, WEIGHT_SCALE, token_label

MAX_PX = 640


def pooled_head_figure(cells: np.ndarray, pool: int, n_tokens: int, title: str) -> go.Figure:
    """One head as exact block means, axes in token positions: a cell's centre sits at its block's middle.

    Shape: cells (m, m), block ``pool`` positions wide (the last may be shorter).
    """
    m = cells.shape[0]
    starts = np.arange(m) * pool
    ends = np.minimum(starts + pool, n_tokens) - 1
    centres = (starts + ends) / 2
    fig = go.Figure(go.Heatmap(
        z=np.round(cells, 5).astype(np.float32), x=centres, y=centres, colorscale=WEIGHT_SCALE, zmin=0,
        zmax=float(np.nanmax(cells)) or 1.0, colorbar=dict(thickness=10, title=dict(text="share")),
        hovertemplate="queries around %{y:.0f}<br>keys around %{x:.0f}<br>share %{z:.4f}<extra></extra>",
    ))
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), height=MAX_PX, dragmode="select", clickmode="event+select",
        margin=dict(l=60, r=20, t=60, b=20),
        xaxis=dict(title="key position", side="top", range=[-0.5, n_tokens - 0.5], showgrid=False),
        yaxis=dict(title="query position", autorange="reversed", showgrid=False, scaleanchor="x"),
    )
    return fig


def grouped_head_figure(cells: np.ndarray, labels: list[str], title: str) -> go.Figure:
    """One head between groups of tokens (sentences or lines). Shape: cells (group, group)."""
    fig = go.Figure(go.Heatmap(
        z=np.round(cells, 5).astype(np.float32), x=labels, y=labels, colorscale=WEIGHT_SCALE, zmin=0,
        colorbar=dict(thickness=10, title=dict(text="share")),
        hovertemplate="from %{y}<br>to %{x}<br>share %{z:.4f}<extra></extra>",
    ))
    ticks = dict(showticklabels=len(labels) <= 40, showgrid=False)
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=MAX_PX, margin=dict(l=10, r=20, t=60, b=10),
                      xaxis=dict(side="top", **ticks), yaxis=dict(autorange="reversed", **ticks))
    return fig


def window_figure(weights: np.ndarray, tokens: tuple[str, ...], rows: tuple[int, int], cols: tuple[int, int],
                  masked: np.ndarray, title: str, value: str = "weight") -> go.Figure:
    """An exact window of one head, "position: token" on both axes, masked cells grey (no value).

    Shape: weights (rows, cols); masked (rows, cols) bool.
    """
    y = [f"{i}: {token_label(tokens[i])}" for i in range(*rows)]
    x = [f"{j}: {token_label(tokens[j])}" for j in range(*cols)]
    z = np.where(masked, np.nan, np.round(weights, 6)).astype(np.float32)
    show_x, show_y = len(x) <= 64, len(y) <= 64
    fig = go.Figure(go.Heatmap(
        z=z, x=x, y=y, colorscale=WEIGHT_SCALE, zmin=0, hoverongaps=False,
        colorbar=dict(thickness=10, title=dict(text=value)),
        hovertemplate=f"query %{{y}}<br>key %{{x}}<br>{value} %{{z:.5f}}<extra></extra>",
    ))
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=MAX_PX, plot_bgcolor=MASKED_WEIGHT_COLOR,
                      margin=dict(l=10, r=20, t=60 if show_x else 40, b=10),
                      xaxis=dict(side="top", showticklabels=show_x, tickangle=-90, showgrid=False),
                      yaxis=dict(autorange="reversed", showticklabels=show_y, showgrid=False))
    return fig


def first_token_figure(share: np.ndarray, title: str) -> go.Figure:
    """Each query's weight on the first token (the attention sink). Shape: share (pos,)."""
    # One SVG path, not WebGL: a WebGL context per redraw cost more than the line (Chromium without a GPU).
    fig = go.Figure(go.Scatter(x=np.arange(len(share)), y=np.round(share, 5).astype(np.float32), mode="lines",
                                 line=dict(width=1, color="#4c78a8"),
                                 hovertemplate="query %{x}<br>weight on the first token %{y:.4f}<extra></extra>"))
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=220, margin=dict(l=10, r=10, t=40, b=30),
                      xaxis=dict(title="query position"), yaxis=dict(range=[0, 1], title="weight"))
    return fig


def relevance_line_figure(values: np.ndarray, tokens: tuple[str, ...], title: str) -> go.Figure:
    """Each position's share (rollout relevance) as a line, the token on hover: bars for thousands of tokens would
    be a wall. Shape: values (pos,)."""
    text = [token_label(tok) for tok in tokens]
    fig = go.Figure(go.Scatter(x=np.arange(len(values)), y=np.asarray(values, dtype=np.float32), text=text,
                                 mode="lines", line=dict(width=1, color="#4c78a8"),
                                 hovertemplate="%{x} %{text}<br>share %{y:.5f}<extra></extra>"))
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=300, margin=dict(l=10, r=10, t=40, b=30),
                      xaxis=dict(title="position"), yaxis=dict(title="share", type="log"))
    return fig
