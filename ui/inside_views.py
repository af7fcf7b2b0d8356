"""What both walks on "Inside the model" draw alike: a tensor as tokens x dimensions, its shape line, per-token
norms. Each walk (``model_core.walk.encoder.Walkthrough``, ``model_core.walk.decoder.DecoderWalk``) labels
its rows with ``labels``."""

from __future__ import annotations

import plotly.graph_objects as go
import streamlit as st

from attention_explorer.figures import token_norms_figure, vector_heatmap
from ui.downloads import figure_config

MAX_DIMS = 64  # columns shown in the vector heatmaps; hover gives exact values


def shape_line(wt, *names: str) -> None:
    """A caption with each named tensor's shape, e.g. ``queries`` (12, 13, 32)."""
    shapes = wt.shapes()
    st.caption(" · ".join(f"`{name}` shape {shapes[name]}" for name in names))


def norm_lines(wt, series: dict[str, str], title: str) -> go.Figure:
    """One line per walk field (label -> field): each token's vector norm."""
    return token_norms_figure(wt.labels, {label: wt.token_norms(name) for label, name in series.items()}, title,
                              reply_start=getattr(wt, "reply_start", None))


def dims_title(what: str, dims: int) -> str:
    return f"{what} (first {min(dims, MAX_DIMS)} of {dims} dims)"


def vectors(wt, name: str, title: str, key: str, *, head: int | None = None, max_dims: int = MAX_DIMS,
            shapes: tuple[str, ...] | None = None, mark: tuple[int, int] | None = None) -> None:
    """One walk tensor (one head's slice with ``head``) as tokens x dimensions, then its shape line.

    ``shapes`` names the tensors the shape line lists (default: this one; () for none); ``mark`` outlines
    the columns [start, stop)."""
    matrix = getattr(wt, name) if head is None else getattr(wt, name)[head]
    fig = vector_heatmap(matrix, wt.labels, title=title, max_dims=max_dims,
                         reply_start=getattr(wt, "reply_start", None))
    if mark is not None:
        fig.add_vrect(x0=mark[0] - 0.5, x1=mark[1] - 0.5, line=dict(color="#e4572e", width=2))
    st.plotly_chart(fig, config=figure_config(f"inside_{key}"), key=key)
    if shapes != ():
        shape_line(wt, *(shapes or (name,)))


def vector_row(wt, *specs: dict) -> None:
    """Walk tensors side by side, one column each; every spec holds ``vectors``' arguments (name, title, key...)."""
    for column, spec in zip(st.columns(len(specs)), specs):
        with column:
            vectors(wt, **spec)
