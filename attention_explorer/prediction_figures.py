"""Figures and tables of what a decoder predicts: the next-token table and the logit lens (data in; no streamlit)."""

from __future__ import annotations

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.colors import sample_colorscale

from attention_explorer.figures import WEIGHT_SCALE, token_label
from model_core import AttentionTrace
from model_core.analysis.predictions import LogitLens, actual_next_ranks
from model_core.words import shown_text  # noqa: F401  (the pages import it from here)

FINAL_COLOR = "#e4572e"  # the heatmaps' sentence-B line colour: the one accent of the app's figures
ORDINALS = ("1st", "2nd", "3rd", "4th", "5th", "6th", "7th", "8th", "9th", "10th")
TABLE_HEIGHT = 420  # px: a scrolling table, however long the input


def _percent(p: float) -> str:
    return f"{p:.0%}" if p >= 0.01 else f"{p:.1%}" if p >= 0.001 else "<0.1%"


def _cell_styles(probs: np.ndarray) -> np.ndarray:
    """CSS for cells shaded by probability on the app's weight scale, text white on dark cells. Shape: as probs."""
    colours = np.array(sample_colorscale(WEIGHT_SCALE, np.clip(probs.ravel(), 0, 1).tolist()), dtype=object)
    text = np.where(probs.ravel() > 0.55, "white", "black")
    css = [f"background-color: {c}; color: {t}" for c, t in zip(colours, text)]
    return np.array(css, dtype=object).reshape(probs.shape)


def prediction_table(trace: AttentionTrace, k: int = 5, tokens: list[str] | None = None) -> pd.io.formats.style.Styler:
    """One row per position: the token, what actually follows it and the rank the model gave that, and the model's
    top-``k`` next tokens with their probabilities, each cell shaded by its probability.

    Args:
        trace: a decoder's trace.
        k: how many predictions to show (at most the trace's own).
        tokens: each position's token as text (decoded); default the trace's tokens.

    Raises:
        ValueError: an encoder's trace (no predictions).
    """
    ranks = actual_next_ranks(trace)  # raises for an encoder
    k = min(k, trace.next_token_ids.shape[1])
    texts = list(tokens) if tokens is not None else list(trace.tokens)
    probs = trace.next_token_probs[:, :k].astype(np.float64)
    kept = trace.next_token_ids.shape[1]
    frame = pd.DataFrame({
        "pos": range(trace.n_tokens),
        "token": [shown_text(t) for t in texts],
        "next in text": [shown_text(texts[i + 1]) if i + 1 < len(texts) else "—" for i in range(trace.n_tokens)],
        "its rank": ["—" if i + 1 == trace.n_tokens else (str(r) if r is not None else f">{kept}")
                     for i, r in enumerate(ranks)],
    })
    for j in range(k):
        frame[ORDINALS[j]] = [f"{shown_text(row[j])}  {_percent(p)}"
                              for row, p in zip(trace.next_token_strings, probs[:, j])]
    styles = pd.DataFrame("", index=frame.index, columns=frame.columns)
    styles[list(ORDINALS[:k])] = _cell_styles(probs)
    return frame.style.apply(lambda _: styles, axis=None)


def logit_lens_figure(lens: LogitLens, *, title: str = "") -> go.Figure:
    """Layer × rank: each row is one layer's residual stream read through the final norm and unembedding, its
    ``k`` most probable next tokens written in the cells, coloured by probability. Cells holding the model's final
    prediction are outlined. At most 1,000 px tall.

    Shape: lens rows (layer + 1) x k.
    """
    rows, k = lens.n_rows, lens.k
    labels = list(lens.row_labels)
    ranks = [f"rank {j + 1}" for j in range(k)]
    text = [[token_label(shown_text(s)) for s in row] for row in lens.top_strings]
    row_px = int(np.clip(900 // max(rows, 1), 14, 26))
    fig = go.Figure(go.Heatmap(
        z=lens.top_probs.astype(np.float32), x=ranks, y=labels, text=text, texttemplate="%{text}",
        textfont=dict(size=11 if row_px >= 20 else 9), colorscale=WEIGHT_SCALE, zmin=0.0, zmax=1.0, xgap=1, ygap=1,
        hovertemplate="%{y}, %{x}<br>%{text}: p = %{z:.4f}<extra></extra>",
        colorbar=dict(title=dict(text="probability"), thickness=12),
    ))
    # Category axes place cell (i, j) at indices (j, i): one outline a cell, the first one named in the legend.
    hits = np.argwhere(lens.top_ids == lens.final_id)
    for n, (i, j) in enumerate(hits):
        fig.add_shape(type="rect", x0=j - 0.5, x1=j + 0.5, y0=i - 0.5, y1=i + 0.5,
                      line=dict(color=FINAL_COLOR, width=2),
                      name=f"final prediction {token_label(shown_text(lens.final_string))}", showlegend=n == 0)
    fig.update_layout(
        title=dict(text=title, font=dict(size=14)), height=int(np.clip(130 + row_px * rows, 300, 1000)),
        margin=dict(l=10, r=10, t=40 if title else 10, b=10), plot_bgcolor="white",
        legend=dict(orientation="h", y=-0.02, yanchor="top", x=0),
        xaxis=dict(side="top", type="category"), yaxis=dict(autorange="reversed", type="category"),
    )
    return fig


def final_prediction_figure(lens: LogitLens) -> go.Figure:
    """The probability every layer gives the model's final prediction (log scale), its rank on hover.

    Shape: lens.final_probs (layer + 1,).
    """
    labels = list(lens.row_labels)
    exact = lens.final_probs.astype(np.float64)
    fig = go.Figure(go.Scatter(
        x=labels, y=np.maximum(exact, 1e-12), mode="lines+markers",  # a log axis cannot show 0: floored at 1e-12
        customdata=np.stack([lens.final_ranks.astype(np.float64), exact], axis=1),
        hovertemplate="%{x}<br>p = %{customdata[1]:.3g}<br>rank %{customdata[0]}<extra></extra>",
    ))
    fig.update_layout(
        title=dict(text=f"Probability of the final prediction {token_label(shown_text(lens.final_string))} "
                        "after each layer", font=dict(size=13)),
        height=300, margin=dict(l=10, r=10, t=40, b=10), template="plotly_white",
        xaxis=dict(type="category", tickangle=-60 if len(labels) > 16 else 0),
        yaxis=dict(type="log", title="probability", range=[-12, 0.05], dtick=3, exponentformat="power"),
    )
    return fig
