"""Per-head statistics as a layer x head grid (Clark et al. 2019); a click opens the head."""

from __future__ import annotations

import numpy as np
import streamlit as st

from model_core.analysis import TRACE_STAT_NAMES, stat_titles
from model_core.io.tables import rows_to_csv
from ui.analysis_widgets import (
    bundle_buttons,
    clicked_cell,
    csv_button,
    how_to_read,
    show_figure,
)
from ui.context import require_trace
from ui.guard import memory_guard
from ui.derived import analysis_bundle, cached_head_stats
from attention_explorer.figures import layer_head_figure
from ui.focus import set_focus
from ui.run_traces import with_page_traces
from ui.state import head_fragment, open_page_if_requested

HEATMAPS_PAGE = "pages/heatmaps.py"

OPEN_FLAG = "_stats_open_heatmaps"


def _open_clicked() -> None:
    # Callbacks run before the sidebar's head picker is drawn, so they may set its state.
    cell = clicked_cell("stats_grid")
    if cell is not None:
        set_focus(*cell)
        st.session_state[OPEN_FLAG] = True


def _open_focused() -> None:
    st.session_state[OPEN_FLAG] = True  # the sidebar's picker has already focused the head


def _open_button(layer: int, head: int) -> None:
    """The button that opens the sidebar's focused head in the heatmaps (in the picker's fragment)."""
    open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)  # the button's click reruns only the fragment
    st.button(f"Open layer {layer}, head {head} in the heatmaps", key="stats_open", on_click=_open_focused,
              help="Pick the layer and head in the sidebar.")


def _picker(n_layers: int, n_heads: int) -> None:
    head_fragment("stats_head", _open_button, slot=ctx.head_slot, n_layers=n_layers, n_heads=n_heads,
                  settings=ctx.settings)


open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)

st.header("Head statistics")
ctx = require_trace(compact=True)
if ctx.compact is not None:  # a long input: the statistics streamed while its compact trace was built
    from ui import compact_heatmaps

    compact_heatmaps.draw_stats(ctx, every=True)
    _picker(ctx.compact.n_layers, ctx.compact.n_heads)
    st.stop()
trace = ctx.trace
names = ctx.markers  # [CLS]/[SEP], or a decoder's first token and other special tokens
titles = stat_titles(trace)
how_to_read(
    "One number per head, averaged over the query tokens of this input. **Entropy** (bits): low = the head "
    f"focuses on few tokens, high = it spreads its attention (log₂ n is uniform). **Share to {names.first} / "
    f"{names.sep} / punctuation / self**: the mean weight on those tokens. **Previous / next token**: the mean "
    "weight on the token just before / after — positional heads score near 1. **A→B / B→A** (sentence pairs "
    f"only): the mean weight a word of one sentence puts on the words of the other, {names.first} and "
    f"{names.sep} excluded. **Largest weight**: the largest single weight anywhere in the head (not an "
    "average; a causal model's first query, which can only look at itself, is left out). **Click a cell** to open that head in the focused heatmap."
    + (f" A decoder has no classification or separator token: its share to {names.first} (whatever that "
       "token is) shows the “attention sink”, where a head with nothing to look at parks its attention (Xiao et al., 2023), and "
       f"{names.sep} are the tokenizer's special tokens after the first (an end-of-text or end-of-turn token). "
       "Being causal, a decoder never looks at the next token, and sentence A, which comes first, never at B."
       if trace.is_decoder else ""),
    "Clark, Khandelwal, Levy & Manning (2019), “What Does BERT Look At? An Analysis of BERT's Attention”, "
    "BlackboxNLP.",
)

stats = cached_head_stats(trace)


@st.fragment
@memory_guard()  # its own reruns are outside app.py's handler
@with_page_traces  # a rerun of the fragment takes the trace from the cache (ui.run_traces)
def stat_grid() -> None:
    """The statistic picker and its grid: choosing another statistic reruns only this part."""
    open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)  # a click on a cell (its callback ran before this rerun)
    defined = [n for n in TRACE_STAT_NAMES if np.isfinite(getattr(stats, n)).any()]
    stat = st.selectbox("Statistic", defined, format_func=titles.get, key="stats_name")
    if "to_sep" not in defined:
        st.caption(f"“{titles['to_sep']}” is left out: this input has none.")
    grid = getattr(stats, stat)
    zmax = float(np.log2(trace.n_tokens)) if stat == "entropy" else 1.0
    fig = layer_head_figure(grid, titles[stat], zmin=0.0, zmax=zmax, colorbar="bits" if stat == "entropy" else "share",
                            clickable=True)
    show_figure(fig, f"{trace.model_kind}_head_stats_{stat}", key="stats_grid", on_select=_open_clicked)

    order = np.argsort(np.nan_to_num(grid, nan=-np.inf).ravel())[::-1][:3]
    top = ", ".join(f"layer {i // trace.n_heads} head {i % trace.n_heads} ({grid.ravel()[i]:.2f})" for i in order)
    st.caption(f"Highest: {top}.")


stat_grid()
_picker(trace.n_layers, trace.n_heads)

st.subheader("Download")
csv_button("All statistics, one row per head (CSV)", rows_to_csv(stats.to_rows()), "head_stats.csv", "stats_csv")
bundle_buttons(lambda: analysis_bundle(ctx.trace), f"{trace.model_kind}_analysis", "stats_bundle")
