"""Direct logit attribution: each head's, each MLP's and the embedding's direct effect on the next-token logit."""

import streamlit as st

from attention_explorer.attribution import heads_figure, parts_figure, what_is_split
from model_core.effects.attribution import NotOneToken
from model_core.io.tables import rows_to_csv
from ui.analysis_widgets import csv_button, how_to_read, show_figure
from ui.attribution import (
    OPEN_FLAG,
    cached_attribution,
    cached_long_attribution,
    choose_tokens,
    pick_clicked,
    split_view,
    top_heads_table,
    top_ids,
)
from ui.compact import full_trace_tokens
from ui.context import require_trace
from ui.loaders import pretrained_for, pretrained_key
from ui.state import open_page_if_requested

GRAPH_FLAG = "_dla_open_graph"
NO_FOIL_KEY = "pg_no_foil"

open_page_if_requested(OPEN_FLAG, "pages/heatmaps.py")  # a top head's button (its callback ran before this run)
open_page_if_requested(GRAPH_FLAG, "pages/contributions.py")

st.title("Direct logit attribution")
ctx = require_trace(compact=True)
long = ctx.compact is not None  # a long input: its compact trace keeps no values and no residual stream
t = ctx.compact if long else ctx.trace
st.caption(f"{t.description} · {t.n_tokens} tokens")

if not t.is_decoder:
    st.info("An encoder (BERT, the chapter-3 encoder) predicts no next token, so it has no logit to split: direct "
            "logit attribution needs a decoder such as SmolLM2 (Model → Pretrained model in the sidebar). The "
            "contribution graph shows how much each token and head contributes to an encoder's representations.",
            icon=":material/info:")
    st.button("Open the contribution graph", type="primary", key="dla_to_graph",
              on_click=lambda: st.session_state.__setitem__(GRAPH_FLAG, True))
    st.stop()

loaded = pretrained_for(ctx.request, ctx.settings)  # the cached copy the trace came from
decode = lambda i: loaded.tokenizer.decode([int(i)])
text = tuple(decode(i) for i in t.token_ids)
model_key = pretrained_key(ctx.request, ctx.settings)
best = top_ids(t, *model_key)
top, second = (decode(i) for i in best)

left, right = st.columns(2)
answer_text = left.text_input("Answer token", key="pg_answer", placeholder=f"top prediction: {top!r}",
                              help="As written, leading space included (\" Paris\"); it must be one token. Empty: "
                                   "the model's top prediction after the last token.")
foil_text = right.text_input("Foil token", key="pg_foil", placeholder=f"runner-up: {second!r}",
                             help="The logit difference answer − foil is split. Empty: the runner-up.")
no_foil = right.checkbox("No foil: split the answer's logit itself", key=NO_FOIL_KEY)
try:
    answer_id, foil_id = choose_tokens(loaded.tokenizer, best, answer_text, foil_text, no_foil)
except NotOneToken as exc:
    st.warning(str(exc), icon=":material/warning:")  # the message lists the pieces
    st.stop()
try:
    dla = (cached_long_attribution if long else cached_attribution)(t, *model_key, answer_id, foil_id)
except ValueError as exc:  # a foil that is the answer
    st.warning(str(exc), icon=":material/warning:")
    st.stop()
label = what_is_split(dla, decode)

st.markdown(f"Splitting **{label}** after the last token ({text[-1]!r}) into the direct effect of every component.")
cap = (f" Both are before the model's final-logit softcap ({dla.final_softcap:g}·tanh(x/{dla.final_softcap:g})), "
       "which is not linear." if dla.final_softcap is not None else "")
checks = ("each MLP is run on the residual stream the heads' writes give, so a wrong head write would leave a gap"
          if dla.mlps_run else "this model's MLP effects are each layer's update minus its heads' write, so the sum "
          "holds by construction and checks only the frozen final norm and the unembedding")
st.caption(f"Check: the parts sum to **{dla.total:.4f}**; the model's logit is **{dla.logit:.4f}** ({checks}).{cap}")
limit = full_trace_tokens(t.n_layers, t.n_heads, ctx.settings.full_trace_mb)
st.caption("This text is long, so it has a compact trace (no values, no residual stream): the attribution ran the "
           "model once more, in compact form, keeping each head's z and the residual stream at the last token only."
           if long else f"This text has a full trace, which the attribution reads with no new pass (up to {limit:,} "
           "tokens for this model, AE_FULL_TRACE_MB; a longer text takes one more pass of the model).")

st.subheader("Heads")
show_figure(heads_figure(dla, title=f"Each head's direct effect on {label}", clickable=True),
            f"dla_heads_{t.model_kind}", key="dla_grid", on_select=lambda: pick_clicked("dla_grid", dla.n_heads))
top_heads_table(dla)
csv_button("Every component's effect (CSV: heads, MLPs, embed, rest)", lambda: rows_to_csv(dla.grid_rows()),
           "direct_logit_attribution.csv", "dla_csv")

st.subheader("Embedding, MLPs and the rest")
show_figure(parts_figure(dla), f"dla_parts_{t.model_kind}", key="dla_parts")

st.subheader("One head, by source token")
if long:
    st.info(f"The split over source tokens reads every token's value, which only a full trace keeps: it is drawn for "
            f"texts of up to {limit:,} tokens for this model (AE_FULL_TRACE_MB = {ctx.settings.full_trace_mb:g}).",
            icon=":material/compress:")
else:
    if ctx.words is not None:
        st.caption("The split is per token, as the model reads them, even with words switched on.")
    split = split_view(dla, t, text, label)
    csv_button("This head's effect by source token (CSV)",
               lambda: rows_to_csv([{"position": j, "token": t.tokens[j], "effect": float(v)}
                                    for j, v in enumerate(split)]),
               "direct_logit_attribution_sources.csv", "dla_sources_csv")

how_to_read(
    "Every component adds a vector to the residual stream, and the last one goes through the final norm and the "
    "unembedding to give the logits. With the norm's scale **frozen** at the full final residual, that read-out is "
    "linear, so each component's write gets its own share of the logit: its **direct effect**. The embedding, every "
    "head (its αᵢⱼ·vⱼ summed over the tokens j, through its slice of W_O) and every MLP get one each, and *rest* holds "
    "biases (0 for Llama-like models); together they sum to the logit, as the check line shows: each MLP's share "
    "comes from running it on the heads' writes, so the sum tests them. With a foil "
    "the logit difference is split, which cancels what pushes both tokens alike. Red is towards the answer, blue "
    "against. A direct effect leaves out what a head does **through** later layers (an earlier head that feeds a "
    "later one gets no credit here): activation patching measures that. The split over source tokens shows what the "
    "chosen head moved towards the answer, and from where.",
    "Elhage et al. (2021), *A Mathematical Framework for Transformer Circuits*; Wang et al. (2022), *Interpretability "
    "in the Wild* (IOI); TransformerLens's `decompose_resid` / `stack_head_results`.",
)
