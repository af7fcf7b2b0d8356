"""Downloads every page offers: each figure's toolbar camera (PNG or SVG, one app-wide choice) and bertviz views as files."""

from __future__ import annotations

import streamlit as st

from attention_explorer.figures import FIGURE_FORMATS, plotly_config

FORMAT_KEY = "figure_format"


def format_picker() -> None:
    """The sidebar's one choice of download format for every figure's camera button."""
    st.sidebar.segmented_control("Figure downloads (camera icon on each chart)", FIGURE_FORMATS,
                                 format_func=str.upper, default=FIGURE_FORMATS[0], key=FORMAT_KEY,
                                 help="The camera button above each chart saves it as PNG or as SVG (vector), "
                                      "drawn in your browser.")


def figure_config(name: str) -> dict:
    """``st.plotly_chart``'s config: the camera button downloads ``name``.png or .svg, as the sidebar says."""
    fmt = st.session_state.get(FORMAT_KEY) or FIGURE_FORMATS[0]
    return plotly_config(name, fmt)
