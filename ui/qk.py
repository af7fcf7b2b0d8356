"""The "Why this key" page's data and figures: the QK split of a focused head, computed once per (trace, head, query,
key, versus) for every session (``cached_qk``), and the figures that draw it."""

from __future__ import annotations

from typing import Any

import numpy as np
import plotly.graph_objects as go
import torch

from model_core import TraceRequest
from model_core.io.tables import matrix_to_csv
from model_core.qk.describe import component_label
from model_core.qk.terms import QKTerms, qk_terms
from model_core.trace.resolve import resolve
from ui.trace_cache import per_trace

INDUCTION_TEXT = ("The lighthouse keeper counted seven blue herons before the storm reached the harbour. "
                  "The lighthouse keeper counted seven blue herons before the storm reached the harbour.")
"""The team's ready example: a sentence said twice. In the repeat, an induction head attends from each token to the
token after its first occurrence; its score there follows a previous-token head's writes (K-composition)."""

BARS = 20
"""Bars drawn on each side: the components with the largest |share|."""


@per_trace(spinner="Splitting the score through the hook points…")
def cached_qk(trace: Any, request: TraceRequest, layer: int, head: int, query: int, key: int | None,
              versus: int | None, row: bool) -> QKTerms:
    """``model_core.qk.terms.qk_terms`` of the trace's tokens (the positions the heatmaps show), once per arguments."""
    from ui.loaders import CACHED_MODELS, device  # ui.loaders imports the pages' caches; only needed on a miss

    resolved = resolve(request, device=device(), models=CACHED_MODELS)
    ids = torch.tensor(np.array(trace.token_ids), dtype=torch.long)[None]  # a copy: the trace's arrays are read-only
    types = getattr(trace, "token_type_ids", None)
    types = None if types is None else torch.tensor(np.array(types), dtype=torch.long)[None]
    return qk_terms(resolved.model, resolved.tokenizer, ids, layer, head, query, key, versus, row=row,
                    token_type_ids=types)


def terms_figure(result: QKTerms, terms: np.ndarray, title: str) -> go.Figure:
    """The query component x key component matrix, components grouped by layer, diverging colours around 0."""
    names = [component_label(c) for c in result.components]
    bound = float(np.abs(terms).max()) or 1.0
    fig = go.Figure(go.Heatmap(z=terms, x=names, y=names, colorscale="RdBu", zmin=-bound, zmax=bound, zmid=0,
                               colorbar={"title": "term"},
                               hovertemplate="query's %{y}<br>key's %{x}<br>term %{z:+.4f}<extra></extra>"))
    side = max(360, min(900, 14 * len(names) + 160))
    fig.update_layout(title=title, height=side, margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      xaxis={"title": "key's component", "tickfont": {"size": 9}},
                      yaxis={"title": "query's component", "autorange": "reversed", "tickfont": {"size": 9}})
    return fig


def bars_figure(result: QKTerms, shares: np.ndarray, title: str) -> go.Figure:
    """The ``BARS`` components with the largest |share|, largest first, coloured by sign."""
    order = np.argsort(-np.abs(shares), kind="stable")[:BARS]
    names = [component_label(result.components[i]) for i in order]
    values = shares[order]
    fig = go.Figure(go.Bar(x=values, y=names, orientation="h",
                           marker_color=["#b2182b" if v > 0 else "#2166ac" for v in values],
                           hovertemplate="%{y}: %{x:+.4f}<extra></extra>"))
    fig.update_layout(title=title, height=max(260, 22 * len(names) + 80), margin={"l": 10, "r": 10, "t": 40, "b": 10},
                      yaxis={"autorange": "reversed"}, xaxis={"title": "share of the score", "zeroline": True})
    return fig


def row_figure(result: QKTerms, labels: list[str]) -> go.Figure:
    """The row view: each component's key-side share of the score at every key the query sees."""
    row = result.row
    names = [component_label(c) for c in result.components]
    keys = [f"{j}: {labels[j]}" for j in result.row_keys]
    bound = float(np.abs(row).max()) or 1.0
    fig = go.Figure(go.Heatmap(z=row, x=keys, y=names, colorscale="RdBu", zmin=-bound, zmax=bound, zmid=0,
                               colorbar={"title": "share"},
                               hovertemplate="%{y} at key %{x}<br>share %{z:+.4f}<extra></extra>"))
    fig.update_layout(height=max(360, min(900, 12 * len(names) + 160)), margin={"l": 10, "r": 10, "t": 30, "b": 10},
                      xaxis={"title": "key", "showticklabels": len(keys) <= 80, "tickfont": {"size": 9}},
                      yaxis={"title": "component", "autorange": "reversed", "tickfont": {"size": 9}})
    return fig


def terms_csv(result: QKTerms, terms: np.ndarray) -> str:
    """A terms matrix as CSV: rows the query's components, columns the key's."""
    return matrix_to_csv(terms, result.components, result.components, corner="query component \\ key component")


def row_csv(result: QKTerms) -> str:
    """The row view as CSV: rows the components, columns the keys (position:token)."""
    cols = [f"{j}:{result.tokens[j]}" for j in result.row_keys]
    return matrix_to_csv(result.row, result.components, cols, corner="component \\ key")


def induction_scores(weights: np.ndarray, period: int) -> np.ndarray:
    """Each head's induction score on a sequence repeated with ``period``: the mean attention from each token of the
    repeat to the token after its earlier occurrence. Shape: weights (layer, head, q, k) -> (layer, head)."""
    n = weights.shape[-1]
    rows = np.arange(period, n)
    if len(rows) == 0:
        return np.zeros(weights.shape[:2])
    return weights[:, :, rows, rows - period + 1].mean(axis=-1)
