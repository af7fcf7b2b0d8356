"""Figures of a compact trace (``model_core.compact.trace``), the token x token ones through the one builder
(``attention_explorer.figures.attention_heatmap``): one head pooled at full extent with numeric position axes (so a box
selection reads positions), by sentence or line, an exact rectangular window with token labels; and the lines of the
first-token share and of rollout relevance. A generated sequence's reply start (``reply_start``) is marked on each
(``attention_explorer.reply_marks``); a grouped view's groups are sentences or lines, and are not split by it."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attention_explorer.figures import attention_heatmap, token_label
from attention_explorer.reply_marks import mark_reply

MAX_PX = 640


def pooled_head_figure(cells: np.ndarray, pool: int, tokens: tuple[str, ...], title: str,
                       reply_start: int | None = None) -> go.Figure:
    """One head as exact block means (``attention_heatmap`` pooled), axes in token positions, a box selection on.

    Shape: cells (m, m), block ``pool`` positions wide (the last may be shorter).
    """
    fig = attention_heatmap(cells, tokens, pool=pool, title=title, zmax=None, value_name="share", height=MAX_PX,
                            reply_start=reply_start)
    fig.update_layout(dragmode="select", clickmode="event+select")
    return fig


def grouped_head_figure(cells: np.ndarray, labels: list[str], title: str) -> go.Figure:
    """One head between groups of tokens (sentences or lines; ``labels`` "i: text" from
    ``model_core.compact.views.group_labels``). Shape: cells (group, group)."""
    texts = tuple(label.split(": ", 1)[-1] for label in labels)  # attention_heatmap numbers them again
    return attention_heatmap(cells, texts, title=title, zmax=None, value_name="share", height=MAX_PX)


def window_figure(weights: np.ndarray, tokens: tuple[str, ...], rows: tuple[int, int], cols: tuple[int, int],
                  masked: np.ndarray, title: str, value: str = "weight", reply_start: int | None = None) -> go.Figure:
    """An exact window of one head (``attention_heatmap`` of a window), "position: token" on both axes, masked cells
    grey (no value).

    Shape: weights (rows, cols); masked (rows, cols) bool.
    """
    return attention_heatmap(weights, tokens[rows[0]:rows[1]], key_tokens=tokens[cols[0]:cols[1]],
                             first=(rows[0], cols[0]), masked=masked, title=title, zmax=None, value_name=value,
                             height=MAX_PX, reply_start=reply_start)


def first_token_figure(share: np.ndarray, title: str, reply_start: int | None = None) -> go.Figure:
    """Each query's weight on the first token (the attention sink). Shape: share (pos,)."""
    # One SVG path, not WebGL: a WebGL context per redraw cost more than the line (Chromium without a GPU).
    fig = go.Figure(go.Scatter(x=np.arange(len(share)), y=np.round(share, 5).astype(np.float32), mode="lines",
                                 line=dict(width=1, color="#4c78a8"),
                                 hovertemplate="query %{x}<br>weight on the first token %{y:.4f}<extra></extra>"))
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=220, margin=dict(l=10, r=10, t=40, b=30),
                      xaxis=dict(title="query position"), yaxis=dict(range=[0, 1], title="weight"))
    if reply_start is not None:
        mark_reply(fig, x=reply_start - 0.5)
    return fig


def relevance_line_figure(values: np.ndarray, tokens: tuple[str, ...], title: str,
                          reply_start: int | None = None) -> go.Figure:
    """Each position's share (rollout relevance) as a line, the token on hover: bars for thousands of tokens would
    be a wall. Shape: values (pos,)."""
    text = [token_label(tok) for tok in tokens]
    fig = go.Figure(go.Scatter(x=np.arange(len(values)), y=np.asarray(values, dtype=np.float32), text=text,
                                 mode="lines", line=dict(width=1, color="#4c78a8"),
                                 hovertemplate="%{x} %{text}<br>share %{y:.5f}<extra></extra>"))
    fig.update_layout(title=dict(text=title, font=dict(size=14)), height=300, margin=dict(l=10, r=10, t=40, b=30),
                      xaxis=dict(title="position"), yaxis=dict(title="share", type="log"))
    if reply_start is not None:
        mark_reply(fig, x=reply_start - 0.5)
    return fig
