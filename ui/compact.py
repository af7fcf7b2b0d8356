"""The compact form in the app: tracing a long input with progress and a cancel button, and what a page that
needs the full trace says instead."""

from __future__ import annotations

import math

import streamlit as st

from model_core import TraceRequest
from model_core.compact.trace import CompactTrace
from model_core.compact.views import TraceForm
from model_core.trace.forward import full_trace_bytes
from ui.loaders import get_compact
from ui.waiting import queue_text

CANCELLED_KEY = "compact_cancelled"
COMPACT_PAGES = (("pages/heatmaps.py", "Attention heatmaps", ":material/grid_view:"),
                 ("pages/analysis_head_stats.py", "Head statistics", ":material/bar_chart:"),
                 ("pages/causal.py", "Causal mask & masked scores", ":material/change_history:"),
                 ("pages/analysis_rollout.py", "Rollout & flow (rollout into one token)", ":material/waves:"))
"""The pages that read a compact trace."""
_SHARE = {"forward": (0.0, 0.45), "summary": (0.45, 0.55)}  # each phase's part of the bar (about its time)


def _cancel(key: str) -> None:
    st.session_state[CANCELLED_KEY] = key


def _run_again() -> None:
    st.session_state.pop(CANCELLED_KEY, None)


class _QueueInBar:
    """While the compact trace waits for the gate, its place in the queue in the progress bar (Cancel leaves it)."""

    def __init__(self, bar) -> None:
        self.bar = bar
        self.shown = ""

    def show(self, place: int, running: int) -> None:
        _ = CANCELLED_KEY in st.session_state  # a point where Streamlit ends the run (Cancel, new text, tab closed)
        text = f"{queue_text(place, running)} Cancel leaves the queue."
        if text != self.shown:
            self.bar.progress(0.0, text=text)
            self.shown = text

    def clear(self) -> None:
        if self.shown:
            self.bar.progress(0.0, text="Loading…")


def trace_compact(request: TraceRequest, form: TraceForm) -> CompactTrace | None:
    """The request's compact trace, with a progress bar and a Cancel button while it runs; None when the user
    cancelled it (the page then offers to run it)."""
    key = repr(request)
    if st.session_state.get(CANCELLED_KEY) == key:
        st.warning(f"Cancelled: the compact trace of these {form.n_tokens:,} tokens did not run. Shorten the text, "
                   "or run it.", icon=":material/cancel:")
        st.button("Run it", on_click=_run_again, type="primary", key="compact_run")
        return None
    holder = st.empty()
    with holder.container():
        st.caption(f"{form.n_tokens:,} tokens: traced in compact form ({form.reason}).")
        bar = st.progress(0.0, text="Loading…")
        # A click stops this run at the bar's next update (Streamlit reruns the script) and marks the request.
        st.button("Cancel", on_click=_cancel, args=(key,), key="compact_cancel", icon=":material/stop:")

    def progress(phase: str, done: float) -> None:
        start, share = _SHARE.get(phase, (0.0, 1.0))
        label = "Running the model (sdpa)" if phase == "forward" else "Summarising each layer in blocks"
        bar.progress(min(1.0, start + share * done), text=f"{label}: {done:.0%}")

    trace = get_compact(request, progress, _QueueInBar(bar))
    holder.empty()
    return trace


def full_trace_tokens(n_layers: int, n_heads: int, full_trace_mb: int) -> int:
    """The longest input whose full trace fits AE_FULL_TRACE_MB for a model of this shape."""
    return int(math.sqrt(full_trace_mb * 1e6 / full_trace_bytes(n_layers, n_heads, 1)))


def needs_full_trace(compact: CompactTrace, full_trace_mb: int) -> None:
    """Stop a page that reads every weight: say the limit, why, and where the compact form is drawn."""
    limit = full_trace_tokens(compact.n_layers, compact.n_heads, full_trace_mb)
    gb = full_trace_bytes(compact.n_layers, compact.n_heads, compact.n_tokens) / 1e9
    st.info(f"This text has {compact.n_tokens:,} tokens, so it is traced in **compact form**: queries, keys, each "
            f"row's log-sum-exp and exact block means ({compact.nbytes() / 1e6:,.0f} MB), not every weight "
            f"({gb:,.1f} GB for {compact.n_layers} layers × {compact.n_heads} heads × {compact.n_tokens:,}²). This "
            f"page reads every weight, so it shows inputs of up to {limit:,} tokens for this model "
            f"(AE_FULL_TRACE_MB = {full_trace_mb}). These pages read the compact form:",
            icon=":material/compress:")
    for path, label, icon in COMPACT_PAGES:
        st.page_link(path, label=label, icon=icon)
    st.stop()
