"""The QK split in a notebook and in the app: ``Trace.qk`` returns a ``QK`` with the terms and their figures (the
builders the "Why this key" page draws)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

from model_core.io.tables import matrix_to_csv
from model_core.qk.describe import component_label, describe
from model_core.qk.terms import QKTerms

BARS = 20
"""Bars drawn on each side: the components with the largest |share|."""


@dataclass(frozen=True, eq=False)
class QK:
    """A head's score at (query, key) split into query x key components, with its figures.

    Attributes:
        result: the ``model_core.qk.terms.QKTerms`` (``terms``, ``components``, ``score``, ``weight``, ``versus``,
            ``row``...).
    """

    result: QKTerms

    @property
    def terms(self) -> np.ndarray:
        return self.result.terms

    def __repr__(self) -> str:
        return "\n".join(describe(self.result))

    def terms_figure(self, by_layer: bool = False) -> go.Figure:
        return terms_figure(self.result, self.result.terms, "terms[query component][key component]",
                            by_layer=by_layer)

    def key_figure(self) -> go.Figure:
        return bars_figure(self.result, self.result.key_side, "Key side: what makes this key attractive")

    def query_figure(self) -> go.Figure:
        return bars_figure(self.result, self.result.query_side, "Query side")

    def versus_figure(self) -> go.Figure | None:
        v = self.result.versus
        return None if v is None else bars_figure(self.result, (self.result.terms - v.terms).sum(axis=0),
                                                  "Key side of s - s'")

    def row_figure(self) -> go.Figure | None:
        return None if self.result.row is None else row_figure(self.result, self.result.tokens)


def layer_groups(components: list[str]) -> tuple[list[str], np.ndarray]:
    """Components grouped by layer: ``embed``/``pos``/``bias`` alone, each layer's heads summed ("L3 heads"), each
    MLP alone. Returns the group names and the (group, component) 0/1 matrix that sums them."""
    names: list[str] = []
    index: dict[str, int] = {}
    rows = []
    for c in components:
        group = f"L{c[1:].split('H')[0]} heads" if c.startswith("L") and "H" in c else component_label(c)
        if group not in index:
            index[group] = len(names)
            names.append(group)
        rows.append(index[group])
    member = np.zeros((len(names), len(components)))
    member[rows, np.arange(len(components))] = 1.0
    return names, member


def terms_figure(result: QKTerms, terms: np.ndarray, title: str, *, by_layer: bool = False) -> go.Figure:
    """The query component x key component matrix, diverging colours around 0; ``by_layer``: each layer's heads
    summed into one row and one column (a 30-layer model's 301 components become 61 groups)."""
    names = [component_label(c) for c in result.components]
    if by_layer:
        names, member = layer_groups(result.components)
        terms = member @ terms @ member.T
    bound = float(np.abs(terms).max()) or 1.0
    fig = go.Figure(go.Heatmap(z=terms, x=names, y=names, colorscale="RdBu_r", zmin=-bound, zmax=bound, zmid=0,
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
    fig = go.Figure(go.Heatmap(z=row, x=keys, y=names, colorscale="RdBu_r", zmin=-bound, zmax=bound, zmid=0,
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


