"""Where a generated reply starts, drawn on a figure's token axes: a dashed teal line (sentence B's start is a dotted
orange one) and a small "reply" label. The figure builders call these; a page passes ``reply_start``."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

REPLY_COLOR = "#2a9d8f"
_LINE = dict(color=REPLY_COLOR, width=2, dash="dash")


def mark_reply(fig: go.Figure, *, x: float | None = None, y: float | None = None,
               x_span: tuple[float, float] | None = None, y_span: tuple[float, float] | None = None) -> None:
    """A vertical line at ``x`` (across ``y_span``) labelled "reply", and/or a horizontal one at ``y`` (across
    ``x_span``), in data coordinates; a span of None runs across the whole plot."""
    if x is not None:
        ends = dict(y0=0, y1=1, yref="paper") if y_span is None else dict(y0=y_span[0], y1=y_span[1])
        fig.add_shape(type="line", x0=x, x1=x, line=_LINE, **ends)
        fig.add_annotation(x=x, y=1 if y_span is None else y_span[0], yref="paper" if y_span is None else "y",
                           text="reply ▸", showarrow=False, xanchor="left", yanchor="top",
                           font=dict(size=10, color=REPLY_COLOR))
    if y is not None:
        ends = dict(x0=0, x1=1, xref="paper") if x_span is None else dict(x0=x_span[0], x1=x_span[1])
        fig.add_shape(type="line", y0=y, y1=y, line=_LINE, **ends)


def mark_reply_on_tokens(fig: go.Figure, reply_start: int | None, rows: np.ndarray | None,
                         cols: np.ndarray | None) -> None:
    """``mark_reply`` on category axes of tokens: before the first shown row and column at or after the reply's
    start. ``rows``/``cols``: the positions each axis shows, in order (None: that axis shows no tokens); nothing is
    drawn on an axis wholly on one side of the start, or for a ``reply_start`` of None (a typed-in text).

    Shape: rows (shown rows,) int, cols (shown columns,) int.
    """
    def at(shown: np.ndarray | None) -> float | None:
        if shown is None:
            return None
        index = int(np.searchsorted(np.asarray(shown), reply_start))
        return index - 0.5 if 0 < index < len(shown) else None

    if reply_start is None:
        return
    x, y = at(cols), at(rows)
    if x is None and y is None:
        return
    mark_reply(fig, x=x, y=y, x_span=None if cols is None else (-0.5, len(cols) - 0.5),
               y_span=None if rows is None else (-0.5, len(rows) - 0.5))
