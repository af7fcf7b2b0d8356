"""Attention heatmaps: all layers x heads at a glance, one head in focus, a per-head summary, downloads."""

import numpy as np
import streamlit as st

from model_core.export import matrix_to_csv, trace_to_npz_bytes
from model_core.summary import head_summary, special_token_positions
from ui.context import require_trace
from ui.figures import PLOTLY_CONFIG, attention_heatmap, overview_mosaic, summary_grid
from ui.guard import view_guard
from ui.state import head_fragment, select_head

ctx = require_trace()
t = ctx.trace
FOCUS = "focused_head"  # the fragment that draws the picker and the focused head
st.title("Attention heatmaps")
st.caption(f"{t.description} · {t.n_tokens} tokens")

st.subheader("Overview: every layer × head")
pooled = t.n_tokens > 32
# No outline on the focused head: an unchanged figure is not sent or redrawn again when the head changes.
st.caption("Each small square is one head's attention matrix (queries down, keys across). Click one to focus it "
           "below."
           + (f" At {t.n_tokens} tokens each head is pooled to 32 × 32 blocks here: a cell is the share of "
              "attention a block of queries gives to a block of keys, so each row still sums to 1. The focused "
              "heatmap below is exact." if pooled else ""))


def _focus_clicked_head() -> None:
    """Runs before the script, so the sidebar's layer/head pickers can still take the new value.

    Only the focused-head fragment reruns: the overview and the summaries stay as they are."""
    points = st.session_state["overview"].get("selection", {}).get("points", [])
    # The clickable layer is the mosaic's second trace: one marker per head, in (layer, head) order.
    clicked = [p for p in points if p.get("curve_number") == 1 and "point_index" in p]
    if clicked:
        layer_, head_ = divmod(int(clicked[0]["point_index"]), t.n_heads)
        select_head(layer_, head_)
        st.rerun(FOCUS)


with view_guard("overview"):
    st.plotly_chart(overview_mosaic(t.attentions), config=PLOTLY_CONFIG,
                    key="overview", on_select=_focus_clicked_head, selection_mode="points")


def _focused_head(layer: int, head: int) -> None:
    """The focused head's heatmap and downloads; reruns alone when the layer or head changes."""
    st.subheader(f"Layer {layer}, head {head}")
    hide_special = st.toggle("Hide [CLS] and [SEP]", key="hide_special",
                             help="Drops their rows and columns without renormalising, so the other weights "
                                  "stay exact.")
    hidden = special_token_positions(t.tokens) if hide_special else []
    matrix = t.attentions[layer, head]
    with view_guard("focused heatmap"):
        st.plotly_chart(attention_heatmap(matrix, t.tokens, sentence_b_start=t.sentence_b_start, hide=hidden),
                        config=PLOTLY_CONFIG, key="focus")
    st.caption("Row = query token, column = key token; hover for the exact weight. Rows sum to 1. "
               "The dotted red line marks where sentence B starts.")
    keep = sorted(set(range(t.n_tokens)) - set(hidden))
    c1, c2 = st.columns(2)
    c1.download_button("Download this matrix (CSV)",
                       data=lambda: matrix_to_csv(matrix[np.ix_(keep, keep)], [t.tokens[i] for i in keep],
                                                  [t.tokens[i] for i in keep]),
                       file_name=f"attention_L{layer}_H{head}.csv", mime="text/csv", on_click="ignore")
    c2.download_button("Download the whole trace (NPZ)", data=lambda: trace_to_npz_bytes(t),
                       file_name="attention_trace.npz", mime="application/octet-stream", on_click="ignore")


head_fragment(FOCUS, _focused_head, slot=ctx.head_slot, n_layers=t.n_layers, n_heads=t.n_heads,
              settings=ctx.settings)

st.subheader("Per-head summary")
st.caption("Entropy in bits (low = focused, high = spread out; a uniform row has log₂ n bits), the largest "
           "single weight, and the average share of each query's attention that goes to [CLS] and to [SEP]. "
           "Heads that park most of their attention on [SEP] are often 'no-op' heads (Clark et al., 2019).")
with view_guard("per-head summary"):
    s = head_summary(t)
    g1, g2 = st.columns(2)
    g1.plotly_chart(summary_grid(s.entropy, title="Entropy (bits)"), config=PLOTLY_CONFIG, key="sum_entropy")
    g2.plotly_chart(summary_grid(s.max_weight, title="Maximum weight", zmin=0, zmax=1), config=PLOTLY_CONFIG,
                    key="sum_max")
    g3, g4 = st.columns(2)
    g3.plotly_chart(summary_grid(s.to_cls, title="Share to [CLS]", zmin=0, zmax=1), config=PLOTLY_CONFIG,
                    key="sum_cls")
    g4.plotly_chart(summary_grid(s.to_sep, title="Share to [SEP]", zmin=0, zmax=1), config=PLOTLY_CONFIG,
                    key="sum_sep")
