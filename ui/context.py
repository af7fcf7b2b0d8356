"""The per-run context every page reads: the sidebar's request, its one trace, and the focused head."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

import numpy as np

from model_core import AttentionTrace, TraceRequest
from model_core.settings import Settings
from model_core.words import WordSpans

_KEY = "_app_context"


@dataclass(frozen=True, eq=False)
class AppContext:
    """What app.py computed this run, before the page runs."""

    # What the sidebar asks for; None when its options do not fit together (``error`` says why).
    request: TraceRequest | None
    settings: Settings
    trace: AttentionTrace | None
    error: str | None
    layer: int = 0
    head: int = 0
    # The sidebar container of the layer/head picker; pages in app.PAGES_WITH_HEAD_FRAGMENT fill it.
    head_slot: "object | None" = None
    # The trace's words when the sidebar's "Words, not WordPieces" is on, else None.
    words: WordSpans | None = None

    def labels(self) -> tuple[tuple[str, ...], int | None]:
        """The labels of the views' rows and columns (tokens, or words when the toggle is on) and where
        sentence B starts among them."""
        trace = self.trace
        if self.words is None:
            return trace.tokens, trace.sentence_b_start
        return self.words.words, self.words.word_start(trace.sentence_b_start)

    def shown(self, matrix: np.ndarray) -> tuple[np.ndarray, tuple[str, ...], int | None]:
        """A query x key matrix of the trace as the views show it: merged into words when the toggle is on.

        Returns the matrix, its labels and where sentence B starts in it. Shape: (..., pos, pos) -> same or
        (..., word, word).
        """
        return (matrix if self.words is None else self.words.merge(matrix)), *self.labels()

    def attentions(self) -> np.ndarray:
        """The trace's whole attention stack as the views show it (merged into words when the toggle is on).

        Shape: (layer, head, pos, pos) or (layer, head, word, word).
        """
        if self.words is None:
            return self.trace.attentions
        from ui.derived import word_attentions

        return word_attentions(self.trace)

    def aggregate(self, how: str, layer: int = 0, head: int = 0) -> np.ndarray:
        """``model_core.aggregate.aggregate_heads`` of the stack as the views show it: with words on, a maximum
        over heads is the maximum of the heads' word matrices (merging after the maximum would sum the pieces'
        maxima). Shape: (pos, pos) or (word, word)."""
        from model_core.aggregate import aggregate_heads

        return aggregate_heads(self.attentions(), how, layer, head)


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
