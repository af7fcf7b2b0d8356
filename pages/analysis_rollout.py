"""Attention rollout and attention flow (Abnar & Zuidema 2020)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attention_explorer.analysis_figures import relevance_figure
from attention_explorer.figures import attention_heatmap
from model_core.analysis import FLOW_MAX_TOKENS, FLOW_MAX_TOKENS_ONE_ROW, normalize_rows
from model_core.io.tables import matrix_to_csv, position_labels, token_matrix_to_csv
from model_core.words import markdown_text
from ui.analysis_widgets import (
    bundle_buttons,
    csv_button,
    how_to_read,
    show_figure,
)
from ui.context import require_trace
from ui.guard import memory_guard
from ui.derived import analysis_bundle, rollout_and_flow
from ui.run_traces import with_page_traces

st.header("Attention rollout and attention flow")
ctx = require_trace(compact=True)
if ctx.compact is not None:  # a long input: the rollout into one token, from the compact trace
    from ui import compact_rollout

    compact_rollout.draw(ctx)
    st.stop()
trace = ctx.trace
target = ctx.markers.readout_label  # [CLS], or a decoder's last token
why = ("the token a classifier reads" if not trace.is_decoder else
       f"the one that predicts the next token (“{markdown_text(trace.labels[-1])}” at position {trace.n_tokens - 1})")
how_to_read(
    "Raw attention in a deep layer mixes tokens that were already mixed by the layers below. Both methods "
    "follow the information back to the input tokens. Each layer's heads are averaged and the residual "
    "connection is added as 0.5·I + 0.5·A (rows renormalised; heads switched off are left out). "
    "**Rollout** multiplies these matrices through the layers: row *i* says how much of token *i*'s final "
    "representation comes from each input token (rows sum to 1). **Flow** treats the layers as a network "
    "whose edge capacities are the attention weights and takes the maximum flow from each input token to "
    "each output token; it is shown with rows normalised to sum to 1. Flow solves one max-flow problem per "
    f"token pair: the full matrix is computed up to {FLOW_MAX_TOKENS} tokens and the row of {target} up to "
    f"{FLOW_MAX_TOKENS_ONE_ROW}. The bars show each input token's relevance to {target}, {why}."
    + (" A decoder is causal, so every matrix here is a lower triangle: a token's representation can only come "
       "from itself and the tokens before it." if trace.causal else ""),
    "Abnar & Zuidema (2020), “Quantifying Attention Flow in Transformers”, ACL.",
)

result = rollout_and_flow(trace)
shown_tokens = ctx.labels()[0]  # words when the sidebar asks for them
labels = [f"{i} {t}" for i, t in enumerate(shown_tokens)]
csv_labels = [f"{i} {t}" for i, t in enumerate(ctx.labels(raw=True)[0])]  # the tokenizer's pieces, as CSVs keep them
if ctx.words:
    st.caption(f"Words, not {ctx.pieces}: rollout and flow are computed on the pieces, then merged (rows averaged "
               "over a word's pieces, columns summed).")


@st.fragment
@memory_guard()  # its own reruns are outside app.py's handler
@with_page_traces  # a rerun of the fragment takes the trace from the cache (ui.run_traces)
def rollout_view() -> None:
    """The layer slider with the rollout it picks and its CSV: moving it reruns only this part."""
    layer = st.slider("Rollout up to layer", 0, trace.n_layers - 1, trace.n_layers - 1, key="rollout_layer")
    matrix, tokens, b = ctx.shown(result.rollout[layer])
    show_figure(attention_heatmap(matrix, tokens, title=f"Attention rollout after layer {layer}",
                                  sentence_b_start=b, zmax=None, value_name="share",
                                  masked=ctx.masked(), reply_start=ctx.reply_start()),
                f"{trace.model_kind}_rollout_L{layer}")
    csv_button(f"Rollout after layer {layer} (CSV)", lambda: token_matrix_to_csv(matrix, csv_labels, csv_labels),
               f"rollout_layer{layer}.csv", "rollout_csv")


left, right = st.columns(2)
with left:
    rollout_view()
with right:
    if result.flow is not None:
        flow, tokens, b = ctx.shown(normalize_rows(result.flow))
        show_figure(attention_heatmap(flow, tokens, title="Attention flow (rows normalised)",
                                      sentence_b_start=b, zmax=None, value_name="share",
                                      masked=ctx.masked(), reply_start=ctx.reply_start()),
                    f"{trace.model_kind}_flow")
        csv_button("Flow, raw max-flow values (CSV)", lambda: token_matrix_to_csv(ctx.shown(result.flow)[0], csv_labels, csv_labels),
                   "flow.csv",
                   "flow_csv")
    else:
        st.info(f"The full flow matrix is limited to {FLOW_MAX_TOKENS} tokens and this input has "
                f"{trace.n_tokens}: shorten the text to see it. Rollout above has no limit.")

series = {"rollout": result.target_rollout}
if result.target_flow is not None:
    series["flow (normalised)"] = normalize_rows(result.target_flow[None])[0]
else:
    st.info(f"Flow into {target} is limited to {FLOW_MAX_TOKENS_ONE_ROW} tokens; showing rollout only.")
if ctx.words:  # to a word: the sum over its pieces
    series = {name: ctx.words.merge_columns(values) for name, values in series.items()}
stem = "last_token" if trace.is_decoder else "cls"
if trace.is_decoder:
    st.caption(f"Over many layers a decoder's rollout piles up on {ctx.markers.first}: every layer sends much of "
               "its attention to that sink, and the products compound. Flow, limited by each layer's capacities, "
               "spreads more evenly.")
show_figure(relevance_figure(shown_tokens, series, f"Relevance of each input token to {target} (last layer)",
                             reply_start=ctx.reply_start()),
            f"{trace.model_kind}_{stem}_relevance")

st.subheader("Download")
csv_button(f"Relevance to {target} (CSV)",
           matrix_to_csv(np.stack(list(series.values()), 1), position_labels(csv_labels), list(series)),
           f"{stem}_relevance.csv", "cls_csv")
bundle_buttons(lambda: analysis_bundle(ctx.trace), f"{trace.model_kind}_analysis", "rollout_bundle")
