"""The app's one layer x head grid builder: one grid (``layer_head_figure``) or several grids of one model side by side
in a single figure (``layer_head_grids``), one number per head, layer 0 at the top."""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import plotly.graph_objects as go

MAX_GRID_PX = 1000
"""The tallest a layer x head grid grows (34 px a layer up to 25 layers, then less)."""
GRIDS_A_ROW = 4
"""Grids side by side in ``layer_head_grids`` (2 for models of more than ``NARROW_HEADS`` heads)."""
NARROW_HEADS = 16
GAP = 0.02  # between two grids of a row, in the figure's width (only the first grid of a row numbers its layers)
BAR_GAP = 0.09  # after a grid that carries a colour bar: the bar and its numbers
ROW_GAP_PX = 70  # between rows of grids, beside their titles' lines: the upper row's "head" axis title
TITLE_CHARS = 18  # a grid's title wraps at this many characters when four grids share a row
TITLE_LINE_PX = 17
BAR_PX = 70  # the right margin, for the last grid's colour bar


@dataclass(frozen=True)
class HeadGrid:
    """One grid of ``layer_head_grids``: its values, its title, its colour range (None: the values' own) and its colour
    bar's title. Grids with the same given range and ``colorbar`` share one colour bar.

    Shape: values (layer, head).
    """

    values: np.ndarray
    title: str
    zmin: float | None = None
    zmax: float | None = None
    colorbar: str = ""


def _row_px(n_layers: int) -> int:
    return min(34, (MAX_GRID_PX - 130) // max(n_layers, 1))  # 30 decoder layers still fit in 1,000 px


def _heatmap(grid: HeadGrid, *, colorscale: str, clickable: bool, cell_text: bool, name: str = "") -> go.Heatmap:
    values = np.asarray(grid.values, dtype=float)
    n_layers, n_heads = values.shape
    return go.Heatmap(
        z=values, x=list(range(n_heads)), y=list(range(n_layers)), colorscale=colorscale, zmin=grid.zmin,
        zmax=grid.zmax, colorbar={"title": grid.colorbar}, hoverinfo="skip" if clickable else None,
        hovertemplate=f"layer %{{y}}, head %{{x}}<br>{name + ' ' if name else ''}%{{z:.4f}}<extra></extra>",
        texttemplate="%{z:.2f}" if cell_text and n_heads <= NARROW_HEADS else None)


def _click_markers(values: np.ndarray, row_px: int, **axes: str) -> go.Scatter:
    """An invisible square marker on every defined cell: Streamlit's point selection then reports the clicked
    (head, layer), which a plotly heatmap alone cannot."""
    n_layers, n_heads = values.shape
    layers, heads = np.meshgrid(np.arange(n_layers), np.arange(n_heads), indexing="ij")
    finite = np.isfinite(values.ravel())
    return go.Scatter(
        x=heads.ravel()[finite], y=layers.ravel()[finite], mode="markers", showlegend=False,
        marker={"symbol": "square", "size": max(8, row_px - 8), "color": "rgba(0,0,0,0)"},
        customdata=values.ravel()[finite], hovertemplate="layer %{y}, head %{x}<br>%{customdata:.4f}<extra>click to "
                                                         "open</extra>", **axes)


def layer_head_figure(
    grid: np.ndarray,
    title: str,
    *,
    colorscale: str = "Viridis",
    zmin: float | None = None,
    zmax: float | None = None,
    colorbar: str = "",
    clickable: bool = False,
    cell_text: bool = False,
    height: int | None = None,
) -> go.Figure:
    """One layer x head grid: one number per head, layer 0 at the top. NaN cells stay blank.

    ``cell_text`` writes each value in its cell (up to 16 heads); ``height`` overrides the default
    (34 px a layer, at least 300).

    With ``clickable`` an invisible square marker sits on every defined cell: Streamlit's point
    selection then reports the clicked (head, layer), which a plotly heatmap alone cannot.

    Shape: grid (layer, head).
    """
    spec = HeadGrid(np.asarray(grid, dtype=float), title, zmin, zmax, colorbar)
    n_layers, n_heads = spec.values.shape
    row_px = _row_px(n_layers)
    fig = go.Figure(_heatmap(spec, colorscale=colorscale, clickable=clickable, cell_text=cell_text))
    if clickable:
        fig.add_trace(_click_markers(spec.values, row_px))
    fig.update_xaxes(title="head", tickmode="linear", dtick=1, range=[-0.5, n_heads - 0.5], showgrid=False)
    fig.update_yaxes(title="layer", tickmode="linear", dtick=1, range=[n_layers - 0.5, -0.5], showgrid=False)
    fig.update_layout(title=title, height=height or max(300, row_px * n_layers + 130), clickmode="event+select",
                      dragmode=False, margin={"l": 60, "r": 20, "t": 50, "b": 50}, template="plotly_white")
    return fig


def _colour_axes(grids: Sequence[HeadGrid]) -> list[int]:
    """The colour axis (1, 2, ...) of each grid: one per given (zmin, zmax, colorbar), one per grid of its own range."""
    shared: dict[tuple, int] = {}
    axes = []
    for i, grid in enumerate(grids):
        key = (grid.zmin, grid.zmax, grid.colorbar) if grid.zmin is not None and grid.zmax is not None else i
        axes.append(shared.setdefault(key, len(shared) + 1))
    return axes


def _bar_places(axes: list[int], per_row: int) -> dict[int, int]:
    """The grid after which each colour axis's bar is drawn: its last grid in the first row that uses it."""
    places: dict[int, int] = {}
    for i, axis in enumerate(axes):
        if axis not in places or places[axis] // per_row == i // per_row:
            places[axis] = i
    return places


def _column_domains(has_bar: list[bool], per_row: int) -> list[tuple[float, float]]:
    """Each column's x domain, the same in every row so the grids line up: a wider gap after a column where any row
    draws a colour bar (a bar after the last column sits in the right margin)."""
    gaps = [BAR_GAP if any(has_bar[c::per_row]) else GAP for c in range(per_row - 1)]
    width = (1.0 - sum(gaps)) / per_row
    domains, x = [], 0.0
    for c in range(per_row):
        domains.append((x, x + width))
        x += width + (gaps[c] if c < len(gaps) else 0.0)
    return domains


def layer_head_grids(grids: Sequence[HeadGrid], *, colorscale: str = "Viridis", cell_text: bool = False) -> go.Figure:
    """Several layer x head grids of one model in ONE figure: ``GRIDS_A_ROW`` a row (2 past ``NARROW_HEADS`` heads),
    each with its title above it, sharing a colour bar where their ranges are the same.

    The browser draws one chart instead of one per grid (the heatmaps page's four summaries: each chart has its
    own fixed cost, and the page's drawing decides when eight users at once see their pages). The hover reads
    "layer, head" and the grid's title with the value; a NaN cell stays blank. ``cell_text`` as in
    ``layer_head_figure``.

    Shape: every grid's values (layer, head), the same for all.
    """
    if not grids:
        raise ValueError("layer_head_grids needs at least one grid.")
    shapes = {np.shape(g.values) for g in grids}
    if len(shapes) != 1 or len(next(iter(shapes))) != 2:
        raise ValueError(f"Every grid must have the same (layer, head) shape, got {sorted(shapes)}.")
    n_layers, n_heads = next(iter(shapes))
    per_row = min(len(grids), GRIDS_A_ROW if n_heads <= NARROW_HEADS else 2)
    n_rows = math.ceil(len(grids) / per_row)
    axes = _colour_axes(grids)
    bar_after = _bar_places(axes, per_row)  # the grid after which each colour bar is drawn
    has_bar = [bar_after.get(axis) == i for i, axis in enumerate(axes)]
    columns = _column_domains(has_bar, per_row)
    row_px = _row_px(n_layers)
    plot_px = row_px * n_layers
    titles = ["<br>".join(textwrap.wrap(g.title, TITLE_CHARS * GRIDS_A_ROW // per_row)) or " " for g in grids]
    title_px = TITLE_LINE_PX * max(t.count("<br>") + 1 for t in titles) + 8
    row_gap = ROW_GAP_PX + title_px
    top, bottom = 20 + title_px, 50
    height = top + bottom + n_rows * plot_px + (n_rows - 1) * row_gap
    span = height - top - bottom
    fig = go.Figure()
    layout: dict = {}
    for start in range(0, len(grids), per_row):
        row = start // per_row
        members = list(range(start, min(start + per_row, len(grids))))
        y1 = 1.0 - row * (plot_px + row_gap) / span
        y0 = y1 - plot_px / span
        for i, (x0, x1) in zip(members, columns):
            grid, n = grids[i], "" if i == 0 else str(i + 1)
            fig.add_trace(_heatmap(grid, colorscale=colorscale, clickable=False, cell_text=cell_text,
                                   name=grid.title).update(coloraxis=f"coloraxis{'' if axes[i] == 1 else axes[i]}",
                                                           xaxis=f"x{n}", yaxis=f"y{n}"))
            layout[f"xaxis{n}"] = dict(domain=[x0, x1], anchor=f"y{n}", title="head", tickmode="linear", dtick=1,
                                       range=[-0.5, n_heads - 0.5], showgrid=False)
            # The layers line up across a row: only its first grid numbers them (30 labels a grid cost the browser
            # as much as the grid itself).
            layout[f"yaxis{n}"] = dict(domain=[y0, y1], anchor=f"x{n}", title="layer" if i == start else None,
                                       tickmode="linear", dtick=1, range=[n_layers - 0.5, -0.5], showgrid=False,
                                       showticklabels=i == start)
            fig.add_annotation(text=titles[i], x=(x0 + x1) / 2, y=y1, xref="paper", yref="paper", xanchor="center",
                               yanchor="bottom",
                               showarrow=False, font={"size": 13}, yshift=4)
            if has_bar[i]:
                axis = f"coloraxis{'' if axes[i] == 1 else axes[i]}"
                layout[axis] = dict(colorscale=colorscale, cmin=grid.zmin, cmax=grid.zmax, colorbar=dict(
                    title=grid.colorbar, thickness=10, x=x1 + 0.008, xanchor="left", y=(y0 + y1) / 2,
                    len=(y1 - y0), yanchor="middle"))
    fig.update_layout(height=height, dragmode=False, margin={"l": 60, "r": BAR_PX, "t": top, "b": bottom},
                      template="plotly_white", **layout)
    return fig
