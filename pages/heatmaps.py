"""Attention heatmaps: all layers x heads at a glance, one head in focus, a per-head summary, downloads."""

import numpy as np
import streamlit as st

from model_core.analysis import stat_titles
from model_core.io.export import trace_to_npz_bytes
from model_core.io.tables import matrix_to_csv, position_labels, rows_to_csv, token_matrix_to_csv
from model_core.analysis.aggregate import marker_positions, selection_attention
from ui.context import require_trace
from ui.derived import cached_head_stats, overview_mosaic_cells
from ui.downloads import figure_config
from attention_explorer.figures import (
    HeadGrid,
    attention_heatmap,
    layer_head_grids,
    overview_cells,
    overview_mosaic,
    selection_grid,
)
from ui.focus import set_focus
from ui.guard import view_guard
from ui.state import head_fragment

ctx = require_trace(compact=True)
if ctx.compact is not None:  # a long input: drawn from its compact trace
    from ui import compact_heatmaps

    compact_heatmaps.draw(ctx)
    st.stop()
t = ctx.trace
FOCUS = "focused_head"  # the fragment that draws the picker and the focused head
st.title("Attention heatmaps")
st.caption(f"{t.description} · {t.n_tokens} tokens")
shown_tokens = ctx.labels()[0]  # the labels of every matrix on this page
names = ctx.markers  # [CLS]/[SEP], or a decoder's first token and other special tokens
if ctx.words:
    st.info(ctx.words_note(), icon=":material/join:")
if t.causal:
    st.caption(f"This {t.family.label} is causal: each token attends only to itself and the tokens before it, so "
               "every matrix is a lower triangle (the masked cells above the diagonal are grey in the focused "
               "heatmap)."
               + (f" Much of its attention lands on {names.first} whatever that token is, an \"attention sink\" "
                  "(Xiao et al., 2023): see the share to it in the per-head summary below." if t.is_decoder else ""))

st.subheader("Overview: every layer × head")
cells = overview_cells(t.n_layers, len(shown_tokens))  # per head side: every token, or what its height shows
pooled = len(shown_tokens) > cells
# No outline on the focused head: an unchanged figure is not sent or redrawn again when the head changes.
st.caption("Each small square is one head's attention matrix (queries down, keys across). Click one to focus it "
           "below."
           + (f" At {len(shown_tokens)} tokens each head is pooled to {cells} × {cells} blocks here: a cell is the share of "
              "attention a block of queries gives to a block of keys, so each row still sums to 1. The focused "
              "heatmap below is exact." if pooled else ""))


def _focus_clicked_head() -> None:
    """Runs before the script, so the sidebar's layer/head pickers can still take the new value.

    Only the focused-head fragment reruns: the overview and the summaries stay as they are."""
    points = st.session_state["overview"].get("selection", {}).get("points", [])
    # The clickable layer is the mosaic's second trace: one marker per head, in (layer, head) order.
    clicked = [p for p in points if p.get("curve_number") == 1 and "point_index" in p]
    if clicked:
        layer_, head_ = divmod(int(clicked[0]["point_index"]), ctx.n_heads)  # the trace is not held here
        set_focus(layer_, head_)
        st.rerun(FOCUS)


with view_guard("overview"):
    st.plotly_chart(overview_mosaic(ctx.weights(), max_cells=cells,
                                    mosaic=overview_mosaic_cells(t, ctx.words is not None, cells)),
                    config=figure_config("attention_overview"),
                    key="overview", on_select=_focus_clicked_head, selection_mode="points")


SHOW = {"head": "One head", "layer_mean": "Mean of the layer's heads", "layer_max": "Maximum over the layer's heads",
        "all_mean": "Mean of all layers and heads"}


def _focused_head(layer: int, head: int) -> None:
    """The focused head (or an aggregate) with its downloads; reruns alone when the layer or head changes."""
    show = st.segmented_control("Show", list(SHOW), format_func=SHOW.get, default="head", key="heat_show",
                                help="Beside single heads: the mean or the maximum over the heads of the sidebar's "
                                     "layer, or the mean over every layer and head.") or "head"
    title = {"head": f"Layer {layer}, head {head}", "layer_mean": f"Layer {layer}: mean of its {t.n_heads} heads",
             "layer_max": f"Layer {layer}: maximum over its {t.n_heads} heads",
             "all_mean": f"Mean of all {t.n_layers * t.n_heads} heads"}[show]
    st.subheader(title)
    hide_special = st.toggle(f"Hide {names.first} and {names.sep}", key="hide_special",
                             help="Drops their rows and columns without renormalising, so the other weights "
                                  "stay exact."
                                  + (" With words on, the first word goes with the first token."
                                     if t.is_decoder and ctx.words else ""))
    matrix, (labels, b) = ctx.aggregate(show, layer, head), ctx.labels()
    raw = ctx.labels(raw=True)[0]  # the CSV keeps the tokenizer's pieces
    hidden = marker_positions(t, ctx.words) if hide_special else []
    masked = ctx.masked()
    with view_guard("focused heatmap"):
        st.plotly_chart(attention_heatmap(matrix, labels, sentence_b_start=b, hide=hidden, masked=masked,
                                          reply_start=ctx.reply_start()),
                        config=figure_config(f"attention_{show}_L{layer}_H{head}"), key="focus")
    st.caption("Row = query token, column = key token; hover for the exact weight. Rows sum to 1"
               + (" (not for a maximum over heads)" if show == "layer_max" else "") + ". "
               + ("The dotted red line marks where sentence B starts." if b is not None else "")
               + (" Grey cells are masked: the query may not see that key." if masked is not None else ""))
    keep = sorted(set(range(len(labels))) - set(hidden))
    # A copy: the button keeps its data function until the next run, and a view of one head would keep the
    # trace's whole weights array alive (0.17 GB for SmolLM2 at 400 tokens) in an idle tab.
    kept = matrix[np.ix_(keep, keep)]
    stem = {"head": f"L{layer}_H{head}", "layer_mean": f"L{layer}_mean", "layer_max": f"L{layer}_max",
            "all_mean": "all_mean"}[show] + ("_words" if ctx.words else "")
    c1, c2 = st.columns(2)
    c1.download_button("Download this matrix (CSV)",
                       data=lambda: token_matrix_to_csv(kept, [raw[i] for i in keep], [raw[i] for i in keep],
                                                        row_positions=keep, col_positions=keep),
                       file_name=f"attention_{stem}.csv", mime="text/csv", on_click="ignore")
    c2.download_button("Download the whole trace (NPZ)",
                       data=lambda: trace_to_npz_bytes(ctx.trace, words=ctx.words is not None),  # from the cache
                       file_name="attention_trace.npz", mime="application/octet-stream", on_click="ignore")


head_fragment(FOCUS, _focused_head, slot=ctx.head_slot, n_layers=t.n_layers, n_heads=t.n_heads,
              settings=ctx.settings)

st.subheader("Several tokens at once")
n_shown = len(shown_tokens)
picked = [i for i in st.session_state.get("sel_tokens", []) if isinstance(i, int) and 0 <= i < n_shown]
if picked != st.session_state.get("sel_tokens", []):
    st.session_state["sel_tokens"] = picked  # positions that this input (or the word toggle) no longer has
s1, s2 = st.columns([3, 2])
selected = s1.multiselect("Tokens", range(n_shown), format_func=lambda i: f"{i}: {shown_tokens[i]}", key="sel_tokens",
                          placeholder="Pick any tokens", help="The link keeps the selection.")
direction = s2.radio("Show", ["sent", "received"], horizontal=True, key="sel_direction",
                     format_func={"sent": "what the selection attends to", "received": "what attends to it"}.get)
if selected:
    values = selection_attention(ctx.weights(), selected, direction)  # (layer, head, pos)
    what = ("the mean of the selected rows: how much the selection sends to each token" if direction == "sent" else
            "the sum of the selected columns: how much each token sends to the selection")
    with view_guard("selection grid"):
        st.plotly_chart(selection_grid(values, shown_tokens, title=f"Every layer × head: {what}",
                                       value_name="weight" if direction == "sent" else "share",
                                       reply_start=ctx.reply_start()),
                        config=figure_config("attention_selection_grid"), key="selection_grid")
    rows = [f"L{layer} H{head}" for layer in range(t.n_layers) for head in range(t.n_heads)]
    st.download_button("Download this grid (CSV)",
                       data=lambda: matrix_to_csv(values.reshape(len(rows), -1), rows, position_labels(ctx.labels(raw=True)[0])),
                       file_name=f"selection_{direction}.csv", mime="text/csv", on_click="ignore")
else:
    st.caption("Pick tokens above to see, for every layer × head, what they attend to together (or what attends "
               "to them).")

st.subheader("Per-head summary")
s = cached_head_stats(t)
titles = stat_titles(t)
fourth = "to_sep" if np.isfinite(s.to_sep).any() else "to_prev"  # a decoder's plain text has no later specials
st.caption("Hover a cell for its value. Entropy in bits (low = focused, high = spread out; a uniform row has log₂ n "
           "bits), the largest single weight, and the average share of each query's attention that goes to "
           f"{names.first} and to {names.sep}. "
           + ("Heads that park most of their attention on [SEP] are often 'no-op' heads (Clark et al., 2019)."
              if not t.is_decoder else
              f"On average {float(np.mean(s.to_cls)):.0%} of a query's attention goes to {names.first} (the attention "
              "sink: a head with nothing to look at parks its attention there).")
           + (f" This input has no {names.sep}, so the fourth grid shows the share to the previous token instead."
              if fourth == "to_prev" else ""))
with view_guard("per-head summary"):
    # One chart for the four grids: the browser draws one figure instead of four (each has its own fixed cost).
    st.plotly_chart(layer_head_grids([HeadGrid(getattr(s, name), titles[name], *scale) for name, scale in (
        ("entropy", (None, None)), ("max_weight", (0.0, 1.0)), ("to_cls", (0.0, 1.0)), (fourth, (0.0, 1.0)))]),
                    config=figure_config("head_summary"), key="head_summary")
st.download_button("Download every statistic, one row per head (CSV)", data=lambda: rows_to_csv(s.to_rows()),
                   file_name="head_stats.csv", mime="text/csv", on_click="ignore")
