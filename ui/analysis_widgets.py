"""Streamlit pieces the analysis pages share: charts, export buttons, paper notes."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import plotly.graph_objects as go
import streamlit as st

from ui.downloads import figure_config
from ui.guard import view_guard


def show_figure(fig: go.Figure, name: str, *, key: str | None = None, on_select: Callable[[], None] | None = None) -> Any:
    """Draw ``fig`` with a modebar that downloads it as ``name``.png/.svg.

    With ``on_select`` (a callback; it runs before the next script run, so it may set widget
    state such as the focused head) clicking a point selects it.
    """
    kwargs: dict[str, Any] = {"config": figure_config(name), "key": key}
    if on_select is not None:
        kwargs |= {"on_select": on_select, "selection_mode": "points"}
    with view_guard(name.replace("_", " ")):
        return st.plotly_chart(fig, **kwargs)
    return None


def clicked_cell(chart_key: str) -> tuple[int, int] | None:
    """The (layer, head) of the point clicked in a ``layer_head_figure(clickable=True)`` chart, or None."""
    state = st.session_state.get(chart_key)
    try:
        point = state["selection"]["points"][0]
    except (KeyError, IndexError, TypeError):
        return None
    return int(point["y"]), int(point["x"])


WINDOW = 128  # tokens a readable matrix shows at a time: 512 x 512 in 760 px is 1.5 px a cell


def positions_outside_window(n_tokens: int, key: str, what: str = "panels", size: int = WINDOW) -> list[int]:
    """Past ``size`` tokens (``WINDOW`` by default), a slider picks which ``size`` positions the matrices show.

    Returns the positions to leave out (for ``attention_heatmap(hide=...)``): none for short inputs. Nothing is
    renormalised, and the CSV downloads keep every token.
    """
    if n_tokens <= size:
        return []
    start = st.slider(f"First token shown ({size} at a time)", 0, n_tokens - size, 0, key=key,
                      help=f"The {what} show one window of queries and keys; the CSV downloads have every token.")
    st.caption(f"Tokens {start}–{start + size - 1} of {n_tokens}. Weights are the model's own, not renormalised "
               "to the window, so a row sums to 1 only with the keys outside it.")
    return [*range(start), *range(start + size, n_tokens)]


def csv_button(label: str, text: str | Callable[[], str], file_name: str, key: str) -> None:
    """A download button for CSV text; pass a function to write the CSV only when the button is clicked."""
    st.download_button(label, text, file_name=file_name, mime="text/csv", key=key, on_click="ignore")


def bundle_buttons(make: Callable[[], tuple[bytes, str]], stem: str, key: str) -> None:
    """Download buttons for the whole analysis as NPZ and as JSON, side by side.

    ``make`` returns (NPZ bytes, JSON text); it runs when a button is clicked, not on every run of the page
    (at 512 tokens the bundle took seconds to build and megabytes to hold).
    """
    left, right = st.columns(2)
    with left:
        st.download_button("Whole analysis (NPZ)", lambda: make()[0], file_name=f"{stem}.npz",
                           mime="application/octet-stream", key=f"{key}_npz", on_click="ignore")
    with right:
        st.download_button("Whole analysis (JSON)", lambda: make()[1], file_name=f"{stem}.json",
                           mime="application/json", key=f"{key}_json", on_click="ignore")


def how_to_read(text: str, paper: str) -> None:
    """The view's reading guide and its source, in an expander that starts open."""
    with st.expander("How to read it", expanded=True):
        st.markdown(text)
        st.caption(f"Source: {paper}")
