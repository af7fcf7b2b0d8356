"""Composition scores' figures (the app's and the notebook's) and the notebook call ``composition``.

    import attention_explorer as ae
    c = ae.composition("bundled:SmolLM2-135M-Instruct")
    c.scores.k            # (layer * head, layer * head) K-composition, NaN where a pair cannot compose
    c.figure              # the grid, with buttons for Q, K and V
    c.table()             # the top pairs of each kind (a pandas DataFrame)

No streamlit here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from model_core.qk.composition import KIND_TITLES, KINDS, CompositionScores

BELOW = "#2166ac"  # under the baseline: blue; at it: white; above it: red (the tutorial's RdBu about the baseline)
AT = "#f7f7f7"
ABOVE = "#b2182b"
NOTE = ("From the weights alone (Elhage et al., 2021, as TransformerLens computes them): the norms' scales folded "
        "in, the rotary embedding and the biases left out. Row: the earlier head (its OV circuit writes); column: "
        "the later head (its query, key or value side reads). White is the random baseline.")


def composition_figure(scores: CompositionScores, kind: str, *, title: str | None = None,
                       height: int | None = None) -> go.Figure:
    """One kind's (layer * head) x (layer * head) grid: rows the earlier head, columns the later head, layer-major,
    a thin line between layers, blank where a pair cannot compose; white at the random baseline.

    Shape: scores.scores(kind) (layer * head, layer * head).
    """
    fig = go.Figure(_heatmap(scores, kind))
    n = scores.n_layers * scores.n_heads
    ticks = [layer * scores.n_heads for layer in range(scores.n_layers)]
    step = max(1, int(np.ceil(scores.n_layers / 32)))  # at most 32 layer labels an axis
    axis = {"type": "category", "tickmode": "array", "showgrid": False, "zeroline": False, "range": [-0.5, n - 0.5],
            "tickvals": [f"L{t // scores.n_heads}H0" for t in ticks][::step],
            "ticktext": [f"L{t // scores.n_heads}" for t in ticks][::step]}
    fig.update_xaxes(title="later head (reads)", side="bottom", **axis)
    fig.update_yaxes(title="earlier head (writes)", autorange=None, **{**axis, "range": [n - 0.5, -0.5]})
    line = {"color": "rgba(0,0,0,0.18)", "width": 0.5}
    for start in ticks[1:]:
        fig.add_shape(type="line", x0=start - 0.5, x1=start - 0.5, y0=-0.5, y1=n - 0.5, line=line, layer="above")
        fig.add_shape(type="line", y0=start - 0.5, y1=start - 0.5, x0=-0.5, x1=n - 0.5, line=line, layer="above")
    fig.update_layout(title=title or f"{KIND_TITLES[kind]} (random baseline {scores.baseline[kind]:.3f})",
                      height=height or 720, template="plotly_white", dragmode="zoom",
                      margin={"l": 70, "r": 20, "t": 50, "b": 60})
    return fig


def composition_figures(scores: CompositionScores) -> go.Figure:
    """All three kinds in one figure, buttons above it switching between Q, K and V (the notebook's figure)."""
    fig = composition_figure(scores, "k")
    fig.data = ()
    for kind in KINDS:
        fig.add_trace(_heatmap(scores, kind).update(visible=kind == "k"))
    buttons = [{"label": KIND_TITLES[kind], "method": "update",
                "args": [{"visible": [k == kind for k in KINDS]},
                         {"title": f"{KIND_TITLES[kind]} (random baseline {scores.baseline[kind]:.3f})"}]}
               for kind in KINDS]
    fig.update_layout(updatemenus=[{"type": "buttons", "direction": "right", "buttons": buttons, "active": 1,
                                    "x": 1.0, "xanchor": "right", "y": 1.08, "yanchor": "bottom", "showactive": True}])
    return fig


def top_pair_rows(scores: CompositionScores, n: int = 10, kinds: tuple[str, ...] = KINDS) -> list[dict[str, Any]]:
    """The ``n`` strongest pairs of each kind as table rows (kind, earlier, later, score, × baseline)."""
    return [{"kind": KIND_TITLES[p.kind], "earlier head": f"L{p.source_layer}H{p.source_head}",
             "later head": f"L{p.target_layer}H{p.target_head}", "score": p.score, "x baseline": p.ratio,
             "source_layer": p.source_layer, "source_head": p.source_head, "target_layer": p.target_layer,
             "target_head": p.target_head}
            for kind in kinds for p in scores.top_pairs(kind, n)]


def _colorscale(baseline: float, top: float) -> list[list]:
    """Blue below the baseline, white at it, red above it, on the range [0, top]."""
    mid = min(max(baseline / top, 1e-6), 1 - 1e-6) if top > 0 else 0.5
    return [[0.0, BELOW], [mid, AT], [1.0, ABOVE]]


def _heatmap(scores: CompositionScores, kind: str) -> go.Heatmap:
    grid = scores.scores(kind)
    top = float(np.nanmax(grid)) if np.isfinite(grid).any() else 1.0
    labels = scores.labels()  # category axes: the hover names both heads without a text array of n² labels
    base = scores.baseline[kind]
    return go.Heatmap(
        z=grid.astype(np.float32), x=labels, y=labels, zmin=0.0, zmax=top, colorscale=_colorscale(base, top),
        colorbar={"title": "score"}, hoverongaps=False,
        hovertemplate=f"%{{y}} → %{{x}}<br>{KIND_TITLES[kind]} %{{z:.4f}} (random baseline {base:.4f})"
                      "<extra></extra>")


@dataclass(frozen=True, eq=False)
class Composition:
    """What ``composition`` returns: the scores and their figure.

    Attributes:
        scores: ``model_core.qk.CompositionScores`` (q, k, v grids, the baseline, ``top_pairs``, ``to_json``).
        figure: the grid with buttons for Q-, K- and V-composition (``composition_figures``).
    """

    scores: CompositionScores
    figure: go.Figure

    def grid_figure(self, kind: str) -> go.Figure:
        """One kind's grid alone ("q", "k" or "v")."""
        return composition_figure(self.scores, kind)

    def table(self, n: int = 10) -> Any:
        """The ``n`` strongest pairs of each kind (a pandas DataFrame)."""
        import pandas as pd

        return pd.DataFrame(top_pair_rows(self.scores, n)).drop(
            columns=["source_layer", "source_head", "target_layer", "target_head"])

    def to_json(self) -> dict[str, Any]:
        return self.scores.to_json()


def composition(model: str | None = None, *, device: str | None = None, seed: int = 0) -> Composition:
    """Q-, K- and V-composition of every earlier head into every later head of a model, from its weights, with the
    random baseline (Elhage et al., 2021; TransformerLens's ``all_composition_scores``).

    Args:
        model: a hub id, a local folder or a bundled id (default: the deployment's default model, the bundled
            MiniLM; "bundled:SmolLM2-135M-Instruct" for the bundled decoder).
        device: "auto", "cpu", "cuda" or "mps".
        seed: the random baseline's matrices.

    Raises:
        model_core.ModelLoadError: the model cannot be loaded; the message says why.
    """
    from model_core.qk.composition import composition_for_request
    from model_core.trace.request import TraceRequest

    scores = composition_for_request(TraceRequest("pretrained", "", model_id=model), device=device, seed=seed)
    return Composition(scores, composition_figures(scores))
