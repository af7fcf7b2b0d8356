"""Figures of the head roles (no streamlit): a role's layer x head grid, through the app's one grid builder."""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from attention_explorer.figures import layer_head_figure
from model_core.roles import ROLE_TITLES


def role_grid(grid: np.ndarray, role: str, *, title: str | None = None, clickable: bool = True) -> go.Figure:
    """One role's scores per head on a 0-1 scale. Shape: grid (layer, head)."""
    return layer_head_figure(grid, title or f"{ROLE_TITLES[role]} score", zmin=0.0, zmax=1.0, colorbar="score",
                             clickable=clickable)


def role_pattern_figure(grid: np.ndarray, patterns: np.ndarray, role: str) -> go.Figure:
    """A corpus run's heads coloured by a role score, each cell's pattern type in its hover.

    Shape: grid, patterns (layer, head).
    """
    fig = role_grid(grid, role, title=f"{ROLE_TITLES[role]} score (probe) by head")
    fig.data[0].update(text=np.asarray(patterns, dtype=str),
                       hovertemplate="layer %{y}, head %{x}<br>score %{z:.3f}<br>pattern: %{text}<extra></extra>")
    return fig


def mean_by_pattern(grid: np.ndarray, patterns: np.ndarray) -> dict[str, list]:
    """The mean role score and the number of heads of each pattern type, for a table."""
    types = sorted(set(np.asarray(patterns, dtype=str).ravel().tolist()))
    flat, kinds = np.asarray(grid, dtype=float).ravel(), np.asarray(patterns, dtype=str).ravel()
    return {"pattern": types, "heads": [int((kinds == t).sum()) for t in types],
            "mean score": [float(np.nanmean(flat[kinds == t])) if np.isfinite(flat[kinds == t]).any() else float("nan")
                           for t in types]}
