"""Plotly figures for the analysis pages (contexts, rollout and flow, norms, head statistics, masking).

Figure builders only: each takes numbers from ``model_core.analysis`` and returns a plotly Figure.
No streamlit here, so the figures can be built and checked in plain tests. Token x token matrices are
drawn by ``attention_explorer.figures.attention_heatmap``, the app's one builder for them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from attention_explorer.figures import category_ticks, token_label, token_labels
from attention_explorer.reply_marks import mark_reply_on_tokens
from model_core.analysis.contexts import ContextComparison
from model_core.analysis.masking import MaskingEffect
from model_core.analysis.next_token import NextTokenEffect
from model_core.analysis.norms import SpecialTokenMass


def _layout(fig: go.Figure, title: str, height: int = 420) -> go.Figure:
    fig.update_layout(title=title, height=height, margin={"l": 60, "r": 20, "t": 50, "b": 50}, template="plotly_white")
    return fig


def context_bins_figure(comparison: ContextComparison, layer: int, head: int) -> go.Figure:
    """The two occurrences' binned attention in one head, as grouped bars over the common support."""
    fig = go.Figure()
    for span, dist in ((comparison.first, comparison.dist_first), (comparison.second, comparison.dist_second)):
        fig.add_trace(go.Bar(name=span.label(), x=list(comparison.bins), y=dist[layer, head]))
    fig.update_yaxes(title="share of attention", range=[0, 1])
    js = comparison.js[layer, head]
    return _layout(fig, f"Layer {layer}, head {head}: JS divergence {js:.3f} bits", height=360)


def cosine_by_layer_figure(cosine: np.ndarray, title: str, *, ytitle: str = "cosine similarity") -> go.Figure:
    """A line over the hidden-state layers (0 = embeddings).

    Shape: cosine (layer + 1,).
    """
    x = list(range(len(cosine)))
    fig = go.Figure(go.Scatter(x=x, y=np.asarray(cosine, dtype=float), mode="lines+markers"))
    fig.update_xaxes(title="hidden state after layer (0 = embeddings)", tickmode="linear", dtick=1)
    fig.update_yaxes(title=ytitle)
    return _layout(fig, title, height=320)


def relevance_figure(tokens: Sequence[str], series: Mapping[str, np.ndarray], title: str,
                     reply_start: int | None = None) -> go.Figure:
    """Grouped bars of each token's relevance, one bar group per token ("i: token" on hover, thinned ticks); a
    generated sequence's reply start marked.

    Shape: each series (k_pos,).
    """
    labels = token_labels(tokens)
    fig = go.Figure()
    for name, values in series.items():
        fig.add_trace(go.Bar(name=name, x=labels, y=np.asarray(values, dtype=np.float32),
                             hovertemplate="%{x}<br>%{y:.4f}<extra>" + name + "</extra>"))
    fig.update_xaxes(**category_ticks(labels), tickangle=-60)
    fig.update_yaxes(title="share")
    mark_reply_on_tokens(fig, reply_start, None, np.arange(len(labels)))
    return _layout(fig, title, height=360)


def special_mass_figure(mass: SpecialTokenMass) -> go.Figure:
    """Per layer, the share of raw and of norm-weighted attention on [CLS] and on [SEP] (a decoder's first token
    and other special tokens: the legend names them from ``mass``)."""
    fig = go.Figure()
    styles = {"raw": "solid", "norm-weighted": "dash"}
    for name, values in mass.per_layer().items():
        kind = "raw" if name.startswith("raw ") else "norm-weighted"  # the labels may be several words
        fig.add_trace(
            go.Scatter(
                name=name, x=list(range(len(values))), y=values, mode="lines+markers", line={"dash": styles[kind]}
            )
        )
    fig.update_xaxes(title="layer", tickmode="linear", dtick=1)
    fig.update_yaxes(title="share of attention (mean over heads)", range=[0, 1])
    return _layout(fig, "Attention on special tokens: raw α vs norm-weighted ‖α f(x)‖", height=360)


def masking_hidden_figure(effect: MaskingEffect) -> go.Figure:
    """Cosine and L2 distance of the read-out token's hidden state ([CLS], or a decoder's last token), baseline
    vs masked, per layer."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("cosine similarity", "L2 distance"))
    x = list(range(len(effect.cls_cosine)))
    fig.add_trace(go.Scatter(x=x, y=effect.cls_cosine, mode="lines+markers", name="cosine"), row=1, col=1)
    fig.add_trace(go.Scatter(x=x, y=effect.cls_l2, mode="lines+markers", name="L2"), row=1, col=2)
    fig.update_xaxes(title="hidden state after layer (0 = embeddings)", tickmode="linear", dtick=1)
    fig.update_layout(showlegend=False)
    name = effect.position_label
    name = name[0].upper() + name[1:]
    return _layout(fig, f"{name}'s hidden state (position {effect.position}): baseline vs heads switched off",
                   height=340)


def next_token_figure(effect: NextTokenEffect) -> go.Figure:
    """A decoder's top next-token predictions with all heads on and with some switched off, as paired bars."""
    # repr shows a line break as \n; the rank keeps two tokens that print alike apart.
    labels = [f"{i + 1}. {token_label(repr(s)[1:-1])}" for i, s in enumerate(effect.strings)]
    fig = go.Figure([
        go.Bar(name="all heads on", x=labels, y=effect.baseline, hovertemplate="%{x}<br>p = %{y:.4f}<extra></extra>"),
        go.Bar(name="heads switched off", x=labels, y=effect.masked,
               hovertemplate="%{x}<br>p = %{y:.4f}<extra></extra>"),
    ])
    fig.update_xaxes(tickangle=-45)
    fig.update_yaxes(title="probability", rangemode="tozero")
    return _layout(fig, f"Next-token prediction after position {effect.position}: TV "
                        f"{effect.total_variation:.3f}, KL {effect.kl_bits:.3f} bits", height=360)


def logits_figure(effect: MaskingEffect) -> go.Figure:
    """The classifier logits with and without the masked heads (custom encoder only)."""
    if effect.logits_baseline is None or effect.logits_masked is None:
        raise ValueError("This comparison has no logits: only the custom encoder has a classifier head.")
    labels = [f"label {i}" for i in range(len(effect.logits_baseline))]
    fig = go.Figure(
        [
            go.Bar(name="all heads on", x=labels, y=effect.logits_baseline),
            go.Bar(name="heads switched off", x=labels, y=effect.logits_masked),
        ]
    )
    fig.update_yaxes(title="logit")
    return _layout(fig, "Classifier logits", height=320)
