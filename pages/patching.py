"""Activation patching: which heads carry the difference between a clean and a corrupted prompt, exact and by
attribution, beside how hard each head looks at the tokens that changed."""

import numpy as np
import streamlit as st

from attention_explorer.figures import token_labels
from attention_explorer.patching import (
    attention_effect_figure,
    effect_grid_figure,
    effect_range,
    residual_figure,
)
from model_core.effects.patching import passes_needed
from model_core.effects.patching_run import estimate_correlation, table_for
from model_core.io.tables import grid_to_csv, matrix_to_csv, rows_to_csv
from ui.analysis_widgets import clicked_cell, csv_button, how_to_read, show_figure
from ui.context import require_request
from ui.fields import PAGE_PARAMS
from ui.focus import set_focus
from ui.guard import view_guard
from ui.loaders import get_trace, pretrained_for, pretrained_key
from ui.patching import (
    STOPPED_KEY,
    clean_request,
    finished_exact,
    model_request,
    pair_fields,
    patch_base,
    run_exact,
    softcap_note,
    table_parts,
)
from ui.patching_dataset import MODE_KEY, dataset_mode
from ui.state import open_page_if_requested, use_bundled_decoder

OPEN_FLAG = "_patch_open_heatmaps"
CONTRIB_FLAG = "_patch_open_contributions"
GRID_KEY, TABLE_KEY = "patch_heads_grid", "patch_table"
RESID_VIEW_KEY = PAGE_PARAMS["patch_resid"][0]  # the link carries the residual view

open_page_if_requested(OPEN_FLAG, "pages/heatmaps.py")  # a head's link (its callback ran before this run)
open_page_if_requested(CONTRIB_FLAG, "pages/contributions.py")

st.title("Activation patching")
# Patching runs its own prompts: only the sidebar's model matters, so the page reads the request, not its trace, and
# works whatever the sidebar's text is (empty, too long, or one the model fails on).
ctx = require_request()
request = ctx.request
try:
    loaded = pretrained_for(request, ctx.settings) if request.model == "pretrained" else None  # the model only
except ValueError as exc:  # ModelLoadError: a model id that does not load
    st.error(str(exc), icon=":material/error:")
    st.stop()
if loaded is None or not loaded.family.is_decoder:
    st.info("Activation patching compares the next-token logits of two prompts, and an encoder (BERT, the chapter-3 "
            "encoder) predicts no next token: it reads the whole text at once. Pick a decoder such as SmolLM2 in the "
            "sidebar. The Contributions page works for encoders: it follows what each head and block adds to any "
            "token.", icon=":material/info:")
    left, right = st.columns(2)
    left.button("Use SmolLM2-135M-Instruct", on_click=use_bundled_decoder, type="primary")
    right.button("Open the Contributions page", key="patch_to_graph",
                 on_click=lambda: st.session_state.__setitem__(CONTRIB_FLAG, True))
    st.stop()

mode = st.radio("Patch", ["pair", "dataset"], horizontal=True, key=MODE_KEY,
                format_func={"pair": "One pair", "dataset": "Dataset (mean over pairs)"}.get,
                help="One clean/corrupted pair, or a dataset of pairs: each head's mean effect and its spread.")
if mode == "dataset":
    dataset_mode(model_request(request))
    st.stop()

how_to_read(
    "Two prompts of the same number of tokens: the **clean** one, where the model gives the answer, and the "
    "**corrupted** one, where it gives the foil. The metric is m = logit(answer) − logit(foil) after the last token. "
    "**Exact patching** runs the corrupted prompt again with one activation taken from the clean run: a head's output "
    "z (its slice of the output projection's input) at every position, or the residual stream entering a layer at "
    "one position. Its effect is (m_patched − m_corrupt) / (m_clean − m_corrupt): 1 restores the clean answer, 0 "
    "changes nothing, below 0 pushes further towards the foil. **Attribution patching** estimates every effect at "
    "once from one forward and one backward pass: (z_clean − z_corrupt)·∂m/∂z. Both grids share one colour scale. "
    "The **table** sets each head's attention from the last token to the changed tokens beside its effect: the head "
    "that looks hardest is not always the one that matters. Click a head (grid or table) to open its heatmap on the "
    "clean prompt.",
    "Meng et al. (2022), Locating and Editing Factual Associations in GPT; Wang et al. (2022), Interpretability in "
    "the Wild (IOI); Nanda (2023), Attribution Patching; Heimersheim & Nanda (2024), How to use and interpret "
    "activation patching; Kobayashi et al. (2020) for the norm-weighted column.",
)
clean, corrupt, answer, foil = pair_fields()
model = model_request(request)
key = (model, clean, corrupt, answer, foil)
try:
    with st.spinner("Running both prompts, and attribution patching (one forward and one backward pass)…"):
        runs, attr = patch_base(*key)
except ValueError as exc:  # PatchingError, InputError: what to change
    st.error(str(exc), icon=":material/error:")
    st.stop()
inputs = runs.inputs
changed = ", ".join(f"{i}: {inputs.clean_tokens[i]!r} → {inputs.corrupt_tokens[i]!r}" for i in inputs.differing)
m1, m2, m3 = st.columns(3)
m1.metric("Clean metric", f"{runs.clean:+.3f}", help=f"logit({answer!r}) − logit({foil!r}) after the clean prompt")
m2.metric("Corrupted metric", f"{runs.corrupt:+.3f}", help="The same after the corrupted prompt")
m3.metric("Tokens", inputs.n_tokens, help=f"Positions that differ: {changed}")
st.caption(f"Tokens that differ: {changed}.")

exact = finished_exact(key)
if exact is None or exact.partial:
    needed = passes_needed(runs)
    remaining = needed if exact is None else exact.left
    label = f"{needed} patched passes" if remaining == needed else f"{remaining} of {needed} patched passes left"
    if st.button(f"Run exact patching ({label})", type="primary", key="patch_run",
                 help="Every head and every residual position from the first changed token on, in batches; the "
                      "positions before it are the same in both prompts, so their effect is 0."):
        exact = run_exact(key)
        if not exact.partial:
            st.rerun()  # drawn again from the finished result, without the Run button
if exact is not None and exact.partial:
    st.warning(f"Exact patching was stopped{' by you' if st.session_state.get(STOPPED_KEY) else ''}: "
               f"{int(np.isfinite(exact.heads).sum())} of {exact.heads.size} heads are patched; the blank cells are "
               "not computed. Run it again to patch the rest.", icon=":material/pause_circle:")
heads = exact.heads if exact is not None else np.full_like(attr.heads, np.nan)
scale = effect_range(heads, attr.heads)
rho_heads = rho_resid = float("nan")
if exact is not None:
    rho = estimate_correlation(attr, exact)
    rho_heads, rho_resid = rho["heads"], rho["residual"]


def _open(layer: int, head: int) -> None:
    # A callback: it runs before the sidebar is drawn, so it may set the text and the focused head.
    st.session_state["ctl_text_a"], st.session_state["ctl_text_b"] = clean, ""
    set_focus(layer, head)
    st.session_state[OPEN_FLAG] = True


def _open_clicked() -> None:
    cell = clicked_cell(GRID_KEY)
    if cell is not None:
        _open(*cell)


st.subheader("Each head's output, patched")
left, right = st.columns(2)
with left:
    if exact is None:
        st.info("Exact patching runs when you press **Run exact patching** above (seconds to a minute on a CPU). "
                "Attribution patching's estimate is beside it.", icon=":material/play_circle:")
    else:
        show_figure(effect_grid_figure(heads, "Exact patching" + (" (partial)" if exact.partial else ""),
                                       scale=scale, clickable=True), "patching_exact_heads", key=GRID_KEY,
                    on_select=_open_clicked)
with right:
    show_figure(effect_grid_figure(attr.heads, "Attribution patching (estimate)", scale=scale),
                "patching_attribution_heads", key="patch_attr_grid")
if exact is not None:
    st.metric("Rank correlation, attribution vs exact (heads)", f"{rho_heads:+.3f}",
              help="Spearman's ρ over every patched head: how well the one-pass estimate orders the heads.")

st.subheader("The residual stream, patched per layer and position")
tokens = inputs.corrupt_tokens
resid_scale = effect_range(None if exact is None else exact.residual, attr.residual)
view = st.radio("Residual grid", ["exact", "attribution"], horizontal=True, key=RESID_VIEW_KEY,
                format_func={"exact": "Exact", "attribution": "Attribution (estimate)"}.get,
                label_visibility="collapsed")
if view == "exact" and exact is None:
    st.caption("Run exact patching to fill this grid; attribution patching's estimate is the other view.")
elif view == "exact":
    show_figure(residual_figure(exact.residual, tokens, "Exact patching of resid_pre", scale=resid_scale),
                "patching_exact_residual", key="patch_resid_exact")
    st.caption(f"Rank correlation with attribution patching: {rho_resid:+.3f}.")
else:
    show_figure(residual_figure(attr.residual, tokens, "Attribution patching of resid_pre", scale=resid_scale),
                "patching_attribution_residual", key="patch_resid_attr")

st.subheader("Attention beside effect")
table = None
with view_guard("attention beside effect"):
    trace = get_trace(clean_request(model, clean))
    table = table_for(trace, inputs, heads, attr.heads,
                      table_parts(trace, *pretrained_key(request, ctx.settings), inputs.answer_id, inputs.foil_id))
if table is not None:
    rows = table.to_rows()
    note = softcap_note(loaded.model)
    if note is not None:
        st.caption(note)
    st.caption("One row per head, the largest exact effect first. **attention**: the clean prompt's weight from the "
               "last token to the changed tokens, summed; **norm_weighted**: the same share of ‖α·vW_O‖; "
               "previous_token, duplicate_token, sink: role scores on the clean prompt (induction and retrieval need "
               "the Head roles page's probes: n/a here); **dla**: direct logit attribution to the metric"
               + ("" if table.dla is not None else " (n/a: not available for this model)") + ". Select a row to open "
               "the head's heatmap.")

    def _open_row() -> None:
        picked = st.session_state[TABLE_KEY].selection.rows
        if picked:
            _open(rows[picked[0]]["layer"], rows[picked[0]]["head"])

    st.dataframe(rows, hide_index=True, key=TABLE_KEY, on_select=_open_row, selection_mode="single-row", height=320,
                 column_config={name: st.column_config.NumberColumn(format="%.3f") for name in rows[0]
                                if name not in ("layer", "head")})
    exact_known = exact is not None
    show_figure(attention_effect_figure(table.attention, heads if exact_known else attr.heads,
                                        rho=table.attention_correlation(estimate=not exact_known),
                                        y_title="exact effect" if exact_known else "attribution estimate"),
                "patching_attention_vs_effect", key="patch_scatter")
    if not exact_known:
        st.caption("The points show attribution patching's estimate until exact patching has run.")

st.subheader("Download")
d1, d2, d3 = st.columns(3)
resid_rows = [f"layer {i}" for i in range(runs.n_layers)]
with d1:
    if exact is not None:
        csv_button("Exact heads grid (CSV)", grid_to_csv(exact.heads), "patching_exact_heads.csv", "patch_csv_h")
        csv_button("Exact residual grid (CSV)", lambda: matrix_to_csv(exact.residual, resid_rows, token_labels(tokens)),
                   "patching_exact_residual.csv", "patch_csv_r")
with d2:
    csv_button("Attribution heads grid (CSV)", grid_to_csv(attr.heads), "patching_attribution_heads.csv",
               "patch_csv_ah")
    csv_button("Attribution residual grid (CSV)", lambda: matrix_to_csv(attr.residual, resid_rows,
                                                                        token_labels(tokens)),
               "patching_attribution_residual.csv", "patch_csv_ar")
with d3:
    if table is not None:
        csv_button("Attention beside effect (CSV)", lambda: rows_to_csv(table.to_rows()), "patching_table.csv",
                   "patch_csv_t")
