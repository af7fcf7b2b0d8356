"""The per-run context every page reads: the controls, the one trace, and the focused head."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from model_core import AttentionTrace
from model_core.settings import Settings

_KEY = "_app_context"


@dataclass(frozen=True, eq=False)
class AppContext:
    """What app.py computed this run, before the page runs."""

    controls: "object"
    settings: Settings
    trace: AttentionTrace | None
    error: str | None
    layer: int = 0
    head: int = 0
    # The sidebar container of the layer/head picker; pages in app.PAGES_WITH_HEAD_FRAGMENT fill it.
    head_slot: "object | None" = None


def set_context(ctx: AppContext) -> None:
    st.session_state[_KEY] = ctx


def get_context() -> AppContext:
    """The context app.py stored for this run."""
    if _KEY not in st.session_state:
        # Streamlit's legacy multipage mode runs a pages/ script alone when a fresh server's
        # first visitor opens a sub-page URL, before app.py has ever called st.navigation.
        # Switch that mode off, as st.navigation itself does, and rerun through app.py.
        from streamlit.runtime.pages_manager import PagesManager

        PagesManager.uses_pages_directory = False
        st.rerun()
    return st.session_state[_KEY]


def require_trace() -> AppContext:
    """The context, or stop the page with the reason there is no trace (the sidebar keeps working)."""
    ctx = get_context()
    if ctx.trace is None:
        st.info(ctx.error or "Type a sentence in the sidebar to see its attention.")
        st.stop()
    return ctx
