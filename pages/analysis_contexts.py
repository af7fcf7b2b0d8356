"""One word, two contexts: a word's attention and hidden states in two places (Ethayarajh 2019)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from model_core.analysis import (
    compare_contexts,
    find_occurrences,
    repeated_words,
)
from model_core.io.export import to_json_str, to_npz_bytes
from model_core.io.tables import grid_to_csv, matrix_to_csv
from attention_explorer.analysis_figures import context_bins_figure, cosine_by_layer_figure
from ui.analysis_widgets import bundle_buttons, clicked_cell, csv_button, how_to_read, show_figure
from ui.context import require_trace
from attention_explorer.figures import layer_head_figure
from ui.focus import set_focus

BANK_A = "she sat on the river bank and watched the water"
BANK_B = "he went to the bank to deposit the cash"


def _use_bank_example() -> None:
    # A callback runs before the sidebar widgets are drawn, so it may set their values.
    st.session_state["ctl_text_a"] = BANK_A
    st.session_state["ctl_text_b"] = BANK_B


def _focus_clicked() -> None:
    # A callback runs before the sidebar's head picker is drawn, so it may set the focused head.
    cell = clicked_cell("ctx_js_grid")
    if cell is not None:
        set_focus(*cell)


st.header("One word, two contexts")
ctx = require_trace()
trace = ctx.trace
names = ctx.markers  # [CLS]/[SEP], or a decoder's first token and other special tokens
how_to_read(
    "Pick a word that occurs twice (e.g. *flies* in “time flies like an arrow” / “fruit flies like a "
    "banana”). **Left grid**: for every layer and head, the Jensen-Shannon divergence (bits, 0 = the "
    "word attends the same way in both places, 1 = completely differently) between the word's two "
    "attention distributions. The two occurrences attend over different positions, so each distribution "
    f"is first summed into a **common support**: *categories* — {names.first}, {names.sep}, the word itself, the "
    "token just before, the token just after, the rest of its own sentence, the other sentence — or *offsets* "
    f"relative to the word (−3…+3, farther left/right, {names.first}, {names.sep}). A word split into "
    f"{ctx.pieces} is pooled: the mean of its pieces' rows. "
    + (f"A decoder sees only what came before, so the second occurrence can look back at the first but not "
       f"the other way round; {names.first} is a bin of its own (the attention sink), even when it is part of "
       "the word. " if trace.is_decoder else "")
    + "**Line**: the cosine similarity of the "
    "word's two hidden states after each layer — where it drops, context has started to separate the "
    "senses. Click a cell to see that head's two distributions.",
    "Ethayarajh (2019), “How Contextual are Contextualized Word Representations?”, EMNLP; "
    "Jensen-Shannon divergence: Lin (1991), IEEE Trans. Information Theory.",
)

if ctx.words is not None:
    st.caption(f"Words, not {ctx.pieces}: this page already compares whole words (a split word's pieces are pooled).")
candidates = repeated_words(trace)
if not candidates:
    st.info("No word occurs twice in this input. Type the same word in both sentences, or try an example.")
    st.button("Try the “bank” example", on_click=_use_bank_example)
    st.stop()

c1, c2, c3 = st.columns([2, 2, 1])
word = c1.selectbox("Word", candidates, key="ctx_word")
spans = find_occurrences(trace, word)
labels = [s.label() for s in spans]
if len(spans) > 2:
    pick = c1.multiselect("Two occurrences", range(len(spans)), default=[0, 1], format_func=labels.__getitem__,
                          max_selections=2, key="ctx_pick")
    if len(pick) != 2:
        st.info("Pick two occurrences to compare.")
        st.stop()
    first, second = spans[pick[0]], spans[pick[1]]
else:
    first, second = spans
support = c2.radio("Common support", ["categories", "offsets"], horizontal=True, key="ctx_support")
window = int(c3.number_input("Offset window", 1, 8, 3, key="ctx_window")) if support == "offsets" else 3
st.button("Try the “bank” example", on_click=_use_bank_example)
st.caption(f"Comparing **{first.label()}** with **{second.label()}**.")

result = compare_contexts(trace, first, second, support=support, window=window)
left, right = st.columns(2)
with left:
    grid = layer_head_figure(result.js, "JS divergence of the word's attention (bits)", zmin=0.0, zmax=1.0,
                             colorbar="bits", clickable=True)
    show_figure(grid, f"{trace.model_kind}_{word}_js_grid", key="ctx_js_grid", on_select=_focus_clicked)
with right:
    sep = result.separation_layer
    title = "Cosine of the word's hidden states" + (f" (below 0.9 from layer {sep})" if sep is not None else "")
    show_figure(cosine_by_layer_figure(result.hidden_cosine, title), f"{trace.model_kind}_{word}_hidden_cosine")

layer, head = min(ctx.layer, trace.n_layers - 1), min(ctx.head, trace.n_heads - 1)
show_figure(context_bins_figure(result, layer, head), f"{trace.model_kind}_{word}_L{layer}H{head}_bins")

st.subheader("Download")
d1, d2, d3 = st.columns(3)
with d1:
    csv_button("JS grid (CSV)", grid_to_csv(result.js), f"{word}_js_grid.csv", "ctx_csv_js")
with d2:
    csv_button("Hidden cosine (CSV)",
               matrix_to_csv(result.hidden_cosine[:, None], [f"layer {i}" for i in range(trace.n_layers + 1)],
                             ["cosine"]), f"{word}_hidden_cosine.csv", "ctx_csv_cos")
with d3:
    rows = [f"{o} layer {l} head {h}" for o in ("first", "second") for l in range(trace.n_layers)
            for h in range(trace.n_heads)]
    dists = np.concatenate([result.dist_first.reshape(-1, len(result.bins)),
                            result.dist_second.reshape(-1, len(result.bins))])
    csv_button("Binned distributions (CSV)", matrix_to_csv(dists, rows, list(result.bins)),
               f"{word}_binned_attention.csv", "ctx_csv_bins")
arrays = {"tokens": np.asarray(trace.tokens), "bins": np.asarray(result.bins), "first_span": [first.start, first.end],
          "second_span": [second.start, second.end], "js": result.js, "hidden_cosine": result.hidden_cosine,
          "dist_first": result.dist_first, "dist_second": result.dist_second}
bundle_buttons(lambda: (to_npz_bytes(arrays), to_json_str(arrays)), f"{trace.model_kind}_{word}_contexts", "ctx_bundle")
