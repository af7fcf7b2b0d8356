"""Activation patching's figures (the page's and the notebook's) and the notebook call ``patch``.

    import attention_explorer as ae
    p = ae.patch("When Mary and John went to the store, John gave a drink to",
                 "When Mary and John went to the store, Mary gave a drink to", " Mary", " John")
    p.heads              # (layer, head) exact effects
    p.heads_figure()     # the L x H grid beside ...
    p.attribution_figure()  # ... attribution patching's, on the same diverging scale

No streamlit here.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

import numpy as np
import plotly.graph_objects as go

from attention_explorer.figures import layer_head_figure, token_labels

EFFECT_SCALE = "RdBu_r"
"""Diverging: red where patching restores the clean answer, blue where it pushes the other way, white at 0."""


def effect_range(*grids: np.ndarray | None) -> float:
    """One symmetric colour range for grids shown side by side: the largest |effect| among them, at least 1 (the
    full effect), so the same colour means the same effect in each."""
    values = [np.abs(np.asarray(g, dtype=np.float64)) for g in grids if g is not None]
    finite = [v[np.isfinite(v)] for v in values]
    largest = max((float(v.max()) for v in finite if v.size), default=1.0)
    return max(1.0, largest)


def effect_grid_figure(grid: np.ndarray, title: str, *, scale: float | None = None,
                       clickable: bool = False) -> go.Figure:
    """A (layer, head) grid of effects on the diverging scale ±``scale`` (``effect_range``); NaN cells (not yet
    patched) stay blank. Shape: grid (layer, head)."""
    limit = scale or effect_range(grid)
    return layer_head_figure(grid, title, colorscale=EFFECT_SCALE, zmin=-limit, zmax=limit, colorbar="effect",
                             clickable=clickable)


def mean_effect_figure(mean: np.ndarray, std: np.ndarray, title: str, *, scale: float | None = None) -> go.Figure:
    """Mean patching over a dataset: each head's mean effect on the diverging scale, its spread over the pairs (the
    standard deviation) on hover. Shape: mean, std (layer, head)."""
    fig = effect_grid_figure(mean, title, scale=scale)
    fig.data[0].update(customdata=np.asarray(std, dtype=np.float64),
                       hovertemplate="layer %{y}, head %{x}<br>mean effect %{z:.4f}<br>std over the pairs "
                                     "%{customdata:.4f}<extra></extra>")
    return fig


def residual_figure(grid: np.ndarray, tokens: tuple[str, ...], title: str, *,
                    scale: float | None = None) -> go.Figure:
    """Patching the residual stream: one cell per (layer, position), layer 0 at the top, the corrupted prompt's
    tokens along the bottom. Shape: grid (layer, pos)."""
    grid = np.asarray(grid, dtype=np.float64)
    limit = scale or effect_range(grid)
    n_layers, n = grid.shape
    labels = token_labels(tokens)
    fig = go.Figure(go.Heatmap(
        z=grid, x=labels, y=list(range(n_layers)), colorscale=EFFECT_SCALE, zmin=-limit, zmax=limit,
        colorbar={"title": "effect"}, hovertemplate="layer %{y}, token %{x}<br>effect %{z:.4f}<extra></extra>"))
    fig.update_xaxes(type="category", tickmode="array", tickvals=labels,
                     ticktext=[label.split(": ", 1)[-1] for label in labels], tickangle=-45 if n > 8 else 0,
                     title="position (resid_pre patched here)")
    fig.update_yaxes(title="layer", range=[n_layers - 0.5, -0.5], dtick=1 if n_layers <= 32 else None)
    fig.update_layout(title=title, height=max(320, min(900, 22 * n_layers + 160)), template="plotly_white",
                      margin={"l": 60, "r": 20, "t": 50, "b": 80})
    return fig


def attention_effect_figure(attention: np.ndarray, effect: np.ndarray, *, rho: float,
                            x_title: str = "attention from the last token to the changed tokens",
                            y_title: str = "patching effect") -> go.Figure:
    """Each head as a point: how hard it looks (x) against how much patching it matters (y), with Spearman's ρ in
    the title. Heads not yet patched are left out. Shape: attention, effect (layer, head)."""
    attention, effect = np.asarray(attention, dtype=np.float64), np.asarray(effect, dtype=np.float64)
    layers, heads = np.meshgrid(np.arange(attention.shape[0]), np.arange(attention.shape[1]), indexing="ij")
    keep = np.isfinite(attention) & np.isfinite(effect)
    fig = go.Figure(go.Scatter(
        x=attention[keep], y=effect[keep], mode="markers", customdata=np.stack([layers[keep], heads[keep]], -1),
        marker={"size": 8, "color": effect[keep], "colorscale": EFFECT_SCALE, "cmid": 0.0, "opacity": 0.8,
                "line": {"width": 0.5, "color": "#555"}},
        hovertemplate="layer %{customdata[0]}, head %{customdata[1]}<br>attention %{x:.3f}<br>effect %{y:.3f}"
                      "<extra></extra>"))
    shown = "n/a" if not np.isfinite(rho) else f"{rho:+.2f}"
    fig.add_hline(y=0.0, line={"width": 1, "color": "#999"})
    fig.update_layout(title=f"Attention against effect (Spearman ρ with |effect| = {shown})", height=420,
                      template="plotly_white", xaxis_title=x_title, yaxis_title=y_title,
                      margin={"l": 60, "r": 20, "t": 50, "b": 50})
    return fig


def _read(path: str, doc: str) -> property:
    """A property of ``Patching`` that reads ``path`` (dotted) from its ``result``."""
    get = operator.attrgetter(path)
    return property(lambda self: get(self.result), doc=doc)


@dataclass(frozen=True, eq=False)
class Patching:
    """What ``patch`` returns: arrays, the whole result, and the page's figures.

    Attributes:
        result: ``model_core.effects.patching_run.PatchingResult`` (runs, exact, attribution, table).

    Shape: heads, attribution (layer, head); residual, attribution_residual (layer, pos).
    """

    result: Any

    clean = _read("runs.clean", "The clean prompt's metric logit(answer) − logit(foil).")
    corrupt = _read("runs.corrupt", "The corrupted prompt's metric.")
    heads = _read("exact.heads", "Exact patching of every head. Shape: (layer, head).")
    attribution = _read("attribution.heads", "Attribution patching's estimate of every head. Shape: (layer, head).")
    residual = _read("exact.residual", "Exact patching of resid_pre. Shape: (layer, pos).")
    attribution_residual = _read("attribution.residual", "Attribution patching of resid_pre. Shape: (layer, pos).")

    @property
    def tokens(self) -> tuple[str, ...]:
        """The corrupted prompt's tokens (the residual grid's columns)."""
        return self.result.runs.inputs.corrupt_tokens

    @property
    def rank_correlation(self) -> dict[str, float]:
        """Spearman's ρ of attribution patching with exact patching: {"heads", "residual"}."""
        return self.result.rank_correlation

    def _scale(self) -> float:
        return effect_range(self.heads, self.attribution)

    def heads_figure(self) -> go.Figure:
        return effect_grid_figure(self.heads, "Exact patching: each head's z, clean into corrupted", scale=self._scale())

    def attribution_figure(self) -> go.Figure:
        return effect_grid_figure(self.attribution, "Attribution patching (first-order estimate)",
                                  scale=self._scale())

    def residual_figure(self, attribution: bool = False) -> go.Figure:
        grid = self.attribution_residual if attribution else self.residual
        name = "Attribution patching" if attribution else "Exact patching"
        return residual_figure(grid, self.tokens, f"{name}: the residual stream entering each layer",
                               scale=effect_range(self.residual, self.attribution_residual))

    def table(self) -> Any:
        """Attention beside effect, one row per head, largest |effect| first (a pandas DataFrame)."""
        import pandas as pd

        if self.result.table is None:
            raise ValueError("This result has no table: call patch(..., table=True).")
        return pd.DataFrame(self.result.table.to_rows())

    def scatter(self) -> go.Figure:
        """Attention to the changed tokens against the exact effect, with the rank correlation."""
        table = self.result.table
        if table is None:
            raise ValueError("This result has no table: call patch(..., table=True).")
        return attention_effect_figure(table.attention, table.effect,
                                       rho=table.correlations()["attention_vs_abs_effect"])

    def to_json(self) -> dict[str, Any]:
        return self.result.to_json()


def patch(clean: str, corrupt: str, answer: str, foil: str, *, model: str | None = None, device: str | None = None,
          residual: bool = True, table: bool = True, progress: Any = None) -> Patching:
    """Activation patching of a decoder: each head's ``z`` and each residual position from the clean prompt into the
    corrupted one (exact), and attribution patching's estimate of both.

    Args:
        clean, corrupt: two prompts of the same number of tokens.
        answer, foil: one token each, leading space included (" Paris").
        model: a decoder's hub id, folder or bundled id (default: the bundled SmolLM2-135M-Instruct, offline).
        residual: also patch the residual stream per (layer, position).
        table: also trace the clean prompt for attention beside effect.
        progress: called with (passes done, passes in all) during exact patching.

    Raises:
        model_core.effects.patching_inputs.PatchingError: the message says what to change.
    """
    from model_core.effects.patching_run import patch_prompts
    from model_core.settings import BUNDLED_DECODER_ID

    return Patching(patch_prompts(clean, corrupt, answer, foil, model_id=model or BUNDLED_DECODER_ID, device=device,
                                  residual=residual, table=table, progress=progress))
