"""Norm-weighted attention ‖α f(x)‖ next to raw α (Kobayashi et al. 2020)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from model_core.analysis import norm_weighted_attention
from model_core.io.tables import grid_to_csv, token_matrix_to_csv
from attention_explorer.analysis_figures import special_mass_figure
from ui.analysis_widgets import (
    bundle_buttons,
    csv_button,
    how_to_read,
    show_figure,
    positions_outside_window,
)
from ui.context import require_trace
from ui.derived import analysis_bundle, cached_special_token_mass
from attention_explorer.figures import attention_heatmap, layer_head_figure
from ui.state import head_fragment

st.header("Norm-weighted attention")
ctx = require_trace()
trace = ctx.trace
names = ctx.markers  # [CLS]/[SEP], or a decoder's first token and other special tokens
sinks = "[CLS] or [SEP]" if not trace.is_decoder else names.first
how_to_read(
    "A head's output for a query is Σⱼ αᵢⱼ·f(xⱼ), where f(xⱼ) = vⱼ W_Oʰ is token *j*'s value after the "
    "head's slice of the output projection. What token *j* really contributes is the vector αᵢⱼ·f(xⱼ), "
    "whose size is αᵢⱼ·‖f(xⱼ)‖. **Left**: raw weights α of the focused head (pick it in the sidebar); "
    "**right**: the norm-weighted ‖α f(x)‖ of the same head. A column that is dark on the left but pale on "
    f"the right is a token that receives attention but passes on little — typically {sinks}, used "
    f"as a “no-op” sink. **Line chart**: per layer, the share of all attention mass that lands on {names.first} "
    f"and {names.sep}, raw (solid) and norm-weighted (dashed); the gap is attention that carries little."
    + (f" With grouped-query attention ({trace.n_heads} query heads share {trace.n_kv_heads} key/value heads) the "
       "heads of a group share their values, so they share ‖f(x)‖ up to their slices of the output projection."
       if trace.n_kv_heads < trace.n_heads else ""),
    "Kobayashi, Kuribayashi, Yokoi & Inui (2020), “Attention is Not Only a Weight: Analyzing "
    "Transformers with Vector Norms”, EMNLP.",
)

labels = [f"{i} {t}" for i, t in enumerate(ctx.labels()[0])]
csv_labels = [f"{i} {t}" for i, t in enumerate(ctx.labels(raw=True)[0])]  # the tokenizer's pieces, as CSVs keep them


def _head(layer: int, head: int) -> None:
    """Raw and norm-weighted attention of the focused head, with their CSVs: a head change reruns only this."""
    raw, tokens, b = ctx.shown(trace.weights[layer, head])  # merged into words when the sidebar asks
    weighted = ctx.shown(norm_weighted_attention(trace.weights[layer : layer + 1, head : head + 1],
                                                 trace.value_norms[layer : layer + 1, head : head + 1])[0, 0])[0]
    st.markdown(f"**Layer {layer}, head {head}**")
    hide = positions_outside_window(len(tokens), "norms_window", "two matrices")
    left, right = st.columns(2)
    for col, matrix, title, stem, key in ((left, raw, "raw α", "raw", "norm_raw"),
                                          (right, weighted, "norm-weighted ‖α f(x)‖", "norm_weighted", "norm_weighted")):
        with col:
            show_figure(attention_heatmap(matrix, tokens, title=title, sentence_b_start=b,
                                          hide=hide, masked=ctx.masked(), zmax=float(matrix.max()), value_name="α" if key == "norm_raw" else "‖α f(x)‖",
                                          reply_start=ctx.reply_start()),
                        f"{trace.model_kind}_L{layer}H{head}_{stem}")
            # A copy: a view of one head would keep the trace's whole weights alive while the button waits.
            csv_button(f"{title}, this head (CSV)",
                       lambda m=np.array(matrix): token_matrix_to_csv(m, csv_labels, csv_labels),
                       f"{stem}_L{layer}H{head}.csv", key)


head_fragment("norms_head", _head, slot=ctx.head_slot, n_layers=trace.n_layers, n_heads=trace.n_heads,
              settings=ctx.settings)
mass = cached_special_token_mass(trace)
show_figure(special_mass_figure(mass), f"{trace.model_kind}_special_token_mass")
if not mass.has_sep:
    st.caption(f"This input has no {names.sep}: the chart shows the share on {names.first} alone.")
drop = (mass.raw_cls + mass.raw_sep) - (mass.norm_cls + mass.norm_sep)
on = names.both if mass.has_sep else names.first_short
show_figure(layer_head_figure(drop, f"Share on {on}: raw minus norm-weighted (per head)",
                              colorscale="RdBu", zmin=-1.0, zmax=1.0, colorbar="share"),
            f"{trace.model_kind}_special_share_drop")

st.subheader("Download")
csv_button("Share drop per head (CSV)", grid_to_csv(drop), "special_share_drop.csv", "norm_drop")
bundle_buttons(lambda: analysis_bundle(ctx.trace), f"{trace.model_kind}_analysis", "norm_bundle")
