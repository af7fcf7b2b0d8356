"""The contribution graph in notebooks and on the page: every node's contributions, the graph of one token, and its
Plotly figures (the graph; each head's contribution map beside its attention map, on one colour scale)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import plotly.graph_objects as go
from plotly.subplots import make_subplots

BINS = ((0.0, 0.1, 1.0, 0.35), (0.1, 0.3, 2.0, 0.5), (0.3, 0.6, 3.5, 0.7), (0.6, 1.01, 5.0, 0.9))
"""Edge weight bins: (from, to, line width, opacity)."""
COLOURS = {"attention": "#1f77b4", "attention_residual": "#9a9a9a", "ffn": "#ff7f0e", "ffn_residual": "#9a9a9a"}
MAX_KEY_COLUMNS = 120
"""Key columns a head map shows at most: the keys with the largest attention or contribution in its rows."""


def _flow(trace_core: Any, model: Any, family: Any, progress: Callable[[float], None] | None = None):
    from model_core.effects.graph_source import compact_flow, trace_flow

    if hasattr(trace_core, "lse"):  # a compact trace: one more pass for the residual stream
        n = trace_core.n_layers
        return compact_flow(trace_core, model, family, None if progress is None else lambda la: progress((la + 1) / n))
    return trace_flow(trace_core, model, family)


def contributions(trace_core: Any, model: Any, family: Any, threshold: float | None = None,
                  progress: Callable[[float], None] | None = None) -> list:
    """Every node's contributions in every layer (``LayerContributions``: attention_heads (q, k, head),
    attention_residual, ffn, ffn_residual), after the renormalising threshold when one is given.

    Args:
        trace_core: a full ``AttentionTrace`` (every node of a compact trace would cost n² · H · d a layer).
        model, family: the model the trace came from and its adapter.
    """
    if hasattr(trace_core, "lse"):
        raise ValueError("Every node's contributions need a full trace; for a long text use graph(), which "
                         "computes only the nodes it reaches.")
    layers = _flow(trace_core, model, family).every_layer(progress)
    return layers if threshold is None else [layer.thresholded(threshold) for layer in layers]


def graph(trace_core: Any, model: Any, family: Any, token: int = -1, threshold: float = 0.04,
          flow: Any = None) -> tuple[Any, go.Figure]:
    """The contribution graph of ``token`` (default: the last, a decoder's prediction) and its figure.

    Returns:
        (``ContributionGraph``: edges as arrays, ``to_json()``, ``edge_rows()``; the Plotly figure).
    """
    from model_core.effects.graph import build_graph

    flow = flow or _flow(trace_core, model, family)
    built = build_graph(flow, token, threshold)
    return built, graph_figure(built, _labels(trace_core))


def _labels(trace_core: Any) -> tuple[str, ...]:
    return tuple(getattr(trace_core, "labels", None) or trace_core.tokens)


def stage_label(stage: int) -> str:
    """A stage's axis label: "embeddings", "L3 attention" (resid_mid), "L3 MLP" (resid_post)."""
    if stage == 0:
        return "embeddings"
    return f"L{(stage - 1) // 2} {'attention' if stage % 2 else 'MLP'}"


MAX_HEIGHT_PX = 1000
"""No figure here is taller than this (the page budget): rows and stages are squeezed to fit."""


def graph_figure(built: Any, labels: tuple[str, ...]) -> go.Figure:
    """The graph: layers bottom to top, tokens left to right, only the nodes in the graph. Edge width and opacity
    follow the weight; a click on a node or an attention edge's midpoint selects its layer (customdata[0])."""
    fig = go.Figure()
    src, dst = built.edge_stages()
    nodes = np.array(built.nodes(), dtype=np.int64).reshape(-1, 2)
    positions = sorted(set(nodes[:, 1].tolist()))
    # columns by order among the graph's tokens (positions 3, 4, 5 of 128 would crowd); the position is in the labels
    column = np.zeros(max(positions) + 1, dtype=np.float64)
    column[positions] = np.arange(len(positions))
    for kind, colour in COLOURS.items():
        for lo, hi, width, opacity in BINS:
            pick = np.flatnonzero((built.kind == kind) & (built.weight > lo) & (built.weight <= hi))
            if not len(pick):
                continue
            xs = np.column_stack([column[built.source[pick]], column[built.target[pick]],
                                  np.full(len(pick), np.nan)]).ravel()
            ys = np.column_stack([src[pick], dst[pick], np.full(len(pick), np.nan)]).ravel()
            fig.add_trace(go.Scatter(x=xs, y=ys, mode="lines", line={"width": width, "color": colour}, opacity=opacity,
                                     hoverinfo="skip", showlegend=False))
    att = np.flatnonzero(built.kind == "attention")
    if len(att):
        hover = [f"layer {built.layer[e]}: {labels[built.source[e]]} → {labels[built.target[e]]}<br>"
                 f"weight {built.weight[e]:.3f}; top head {int(np.argmax(built.heads[e]))} "
                 f"({float(np.max(built.heads[e])):.3f})" for e in att]
        fig.add_trace(go.Scatter(x=(column[built.source[att]] + column[built.target[att]]) / 2,
                                 y=(src[att] + dst[att]) / 2,
                                 mode="markers", marker={"size": 6, "color": COLOURS["attention"], "opacity": 0.4},
                                 customdata=np.column_stack([built.layer[att], built.target[att]]), hovertext=hover,
                                 hoverinfo="text", name="attention edge", showlegend=False))
    layer_of = np.maximum((nodes[:, 0] - 1) // 2, 0)
    fig.add_trace(go.Scatter(
        x=column[nodes[:, 1]], y=nodes[:, 0], mode="markers", marker={"size": 8, "color": "#333", "line": {"width": 1, "color": "white"}},
        customdata=np.column_stack([layer_of, nodes[:, 1]]), hoverinfo="text", name="node", showlegend=False,
        hovertext=[f"{labels[p]} (position {p}) · {stage_label(s)}" for s, p in nodes]))
    stages = 2 * built.n_layers + 1
    fig.update_layout(height=min(MAX_HEIGHT_PX, max(420, 14 * stages + 140)), margin={"l": 10, "r": 10, "t": 40, "b": 10}, clickmode="event+select",
                      title=f"Contribution graph of {labels[built.token]!r} (position {built.token}), threshold "
                            f"{built.threshold:g}", plot_bgcolor="white")
    fig.update_xaxes(tickmode="array", tickvals=list(range(len(positions))),
                     ticktext=[f"{labels[p]} ·{p}" for p in positions], tickangle=-60, showgrid=False, zeroline=False,
                     range=[-0.5, len(positions) - 0.5])
    step = max(1, stages // 30)
    fig.update_yaxes(tickmode="array", tickvals=list(range(0, stages, step)),
                     ticktext=[stage_label(s) for s in range(0, stages, step)], range=[-0.7, stages - 0.3],
                     showgrid=True, gridcolor="#eee", zeroline=False)
    return fig


def shown_keys(contrib: np.ndarray, weights: np.ndarray, limit: int = MAX_KEY_COLUMNS) -> np.ndarray:
    """The key positions a head map shows: every key up to ``limit``, else those with the largest attention or
    contribution in the rows, in order. Shape: contrib, weights (rows, head, key) -> (keys,) int."""
    n = contrib.shape[-1]
    if n <= limit:
        return np.arange(n)
    score = np.maximum(contrib.max((0, 1)), weights.max((0, 1)))
    return np.sort(np.argsort(-score, kind="stable")[:limit])


HEAD_MAPS_CAPTION = (
    "Right: each head's attention weights (each head's row sums to 1). Left: each head's contribution within the "
    "head, its (key) terms' proximity shares divided by the sum of that head's terms in the row, so each head's row "
    "also sums to 1 and the two maps compare where a head looks with where what it writes comes from. The title "
    "gives each head's share of the row's attention terms (its terms over all heads' terms, the residual left out, "
    "averaged over the rows): a head that looks hard but has a small share contributes little. Shares are before "
    "the threshold; one colour scale, 0 to 1.")
"""What the head maps show and how each side is normalised (the page's caption)."""


def head_maps_figure(contrib: np.ndarray, weights: np.ndarray, rows: list[int], labels: tuple[str, ...],
                     layer: int) -> go.Figure:
    """Each head's contribution map (within-head shares) beside its attention map, on one colour scale (0 to 1),
    for the query rows; each head's title gives its share of the rows' attention terms (``HEAD_MAPS_CAPTION``).

    Shape: contrib, weights (rows, head, key): each (key, head) term's share of the row's resid_mid
    (``head_shares`` normalises it), and the attention weight.
    """
    from model_core.effects.contributions import head_shares

    n_rows, n_heads, _ = contrib.shape
    keys = shown_keys(contrib, weights)
    within, of_terms = head_shares(contrib)
    share = of_terms.mean(0)  # (head,)
    fig = make_subplots(rows=n_heads, cols=2, shared_xaxes=True, vertical_spacing=min(0.04, 0.5 / n_heads),
                        horizontal_spacing=0.06,
                        subplot_titles=[t for h in range(n_heads) for t in (
                            f"head {h}: contribution within head ({share[h]:.0%} of the terms)",
                            f"head {h}: attention")])
    x = [f"{labels[k]} ·{k}" for k in keys]
    y = [f"{labels[r]} ·{r}" for r in rows]
    for h in range(n_heads):
        for col, data in ((1, within), (2, weights)):
            fig.add_trace(go.Heatmap(z=data[:, h, keys], x=x, y=y, coloraxis="coloraxis",
                                     hovertemplate="from %{x}<br>to %{y}<br>%{z:.3f}<extra></extra>"), row=h + 1, col=col)
    fig.update_layout(coloraxis={"colorscale": "Blues", "cmin": 0.0, "cmax": 1.0}, margin={"l": 10, "r": 10, "t": 50, "b": 10},
                      height=min(MAX_HEIGHT_PX, n_heads * max(60, min(16 * n_rows + 50, 940 // n_heads)) + 60),
                      title=f"Layer {layer}: each head's contribution (left) beside its attention (right)")
    fig.update_yaxes(autorange="reversed")
    return fig


def head_map_rows(contrib: np.ndarray, weights: np.ndarray, rows: list[int], labels: tuple[str, ...],
                  layer: int) -> list[dict[str, Any]]:
    """The head maps as CSV rows, one per (query row, head, key) with a non-zero attention weight or contribution:
    the term's share of resid_mid, its share within the head (the left map), and the attention weight (the right).

    Shape: contrib, weights (rows, head, key), as ``head_maps_figure``.
    """
    from model_core.effects.contributions import head_shares

    within, _ = head_shares(contrib)
    out = []
    for r, h, k in zip(*np.nonzero((contrib > 0) | (weights > 0))):
        out.append({"layer": layer, "to": rows[r], "to_token": labels[rows[r]], "head": int(h), "from": int(k),
                    "from_token": labels[k], "contribution": float(contrib[r, h, k]),
                    "contribution_within_head": float(within[r, h, k]), "attention": float(weights[r, h, k])})
    return out
