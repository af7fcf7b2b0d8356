"""KV cache: what a compression policy (StreamingLLM, Knorm, SnapKV, TOVA, observed attention) keeps of the text's
cache, how much of the last token's attention it keeps, and what it costs the next-token prediction."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attention_explorer.kv import (
    MAX_STACKED,
    kept_keys_figure,
    needle_figure,
    retained_figure,
    sweep_figure,
)
from model_core.generate.needle import ANSWER, QUESTION
from model_core.generate.presses import PRESS_TITLES, PRESSES, check_ratio, n_kept
from model_core.io.tables import grid_to_csv, rows_to_csv
from model_core.settings import BUNDLED_DECODER_ID
from ui.analysis_widgets import clicked_cell, csv_button, how_to_read, show_figure
from ui.context import require_trace
from ui.focus import set_focus
from ui.guard import view_guard
from ui.kv_cache import cached_result, cached_sweep, kept_rows, needle_done, run_needle
from ui.loaders import pretrained_key
from ui.state import choose_model, open_page_if_requested

OPEN_FLAG = "_kv_open_heatmaps"
ENCODER_MESSAGE = ("An encoder (BERT, the chapter-3 encoder) has no KV cache: it reads the whole text at once and "
                   "generates nothing, so there is nothing to keep for later tokens. Pick a decoder such as "
                   "SmolLM2 in the sidebar (Model → Pretrained model → SmolLM2-135M-Instruct).")


def _use_decoder() -> None:
    st.session_state["ctl_model"] = "pretrained"
    choose_model(BUNDLED_DECODER_ID)


def _open_clicked() -> None:
    cell = clicked_cell("kv_retained")
    if cell is not None:
        set_focus(*cell)
        st.session_state[OPEN_FLAG] = True


open_page_if_requested(OPEN_FLAG, "pages/heatmaps.py")
st.title("KV cache")
ctx = require_trace(compact=True)
trace = ctx.trace if ctx.trace is not None else ctx.compact
st.caption(f"{trace.description} · {trace.n_tokens} tokens" + (" · compact trace" if ctx.compact is not None else ""))
if not trace.is_decoder:
    st.info(ENCODER_MESSAGE, icon=":material/info:")
    st.button("Use SmolLM2-135M-Instruct", on_click=_use_decoder, type="primary")
    st.stop()
if ctx.trace is not None and not np.all(ctx.trace.head_mask):
    st.warning("Heads are switched off in this trace; a compressed cache is read with every head on. Switch them "
               "back on in the sidebar to use this page.")
    st.stop()
if trace.n_tokens < 3:
    st.info("A compressed cache needs at least 3 tokens (two to prefill, one to predict from); type a longer text.")
    st.stop()

how_to_read(
    "Every token but the last is **prefilled** into the cache; the policy then keeps ⌊n·(1 − ratio)⌋ of those keys "
    "(and their values) per key/value head, and the **last token runs on the compressed cache at its true "
    "position**. **StreamingLLM** keeps the first 4 tokens (attention sinks) and the most recent ones. **Knorm** "
    "keeps the keys of lowest L2 norm. **SnapKV** scores keys by the attention of the last 64 queries, smoothed over "
    "5 neighbouring keys and averaged over the query heads that share a key/value head; the 64 are always kept. "
    "**TOVA** keeps what the last prefill query attends to most, averaged over all heads (one set per layer). "
    "**Observed attention** (H2O) keeps the keys with the most attention from all queries, divided by how many "
    "queries can see each key. **Retained attention**: the share of the last token's full-cache attention on the "
    "kept keys (its own key not counted). **KL** compares the next-token distributions (nats).",
    "Xiao et al. (2023) StreamingLLM; Devoto et al. (2024) Knorm; Li et al. (2024) SnapKV; Oren et al. (2024) TOVA; "
    "Zhang et al. (2023) H2O; defaults as in NVIDIA's kvpress 0.5.5.",
)
left, right = st.columns(2)
press = left.selectbox("Compression policy", PRESSES, key="pg_press", format_func=PRESS_TITLES.get)
ratio = right.number_input("Compression ratio (share of the keys dropped)", step=0.05, format="%.2f", key="pg_ratio",
                           help="Strictly between 0 and 1: 0.75 keeps a quarter of the prefill's keys.")
try:
    kept_count = n_kept(trace.n_tokens - 1, check_ratio(ratio))
except ValueError as exc:
    st.error(str(exc), icon=":material/error:")
    st.stop()

model_id, device_name = pretrained_key(ctx.request, ctx.settings)
result = cached_result(trace, model_id, device_name, press, float(ratio))
for note in result.notes:
    st.caption(note)

st.subheader("Cost")
m1, m2, m3 = st.columns(3)
m1.metric("Keys kept per key/value head", f"{kept_count} of {result.n_prefill}")
m2.metric("Next-token KL(full ‖ compressed)", f"{result.next_token_kl:.4g} nats")
m3.metric("Top next token", repr(result.text_compressed),
          f"was {result.text_full!r}" if result.top_changed else "unchanged", delta_color="inverse"
          if result.top_changed else "off",
          help=f"Full cache: {result.text_full!r} ({result.p_full:.1%}); compressed: {result.text_compressed!r} "
               f"({result.p_compressed:.1%}).")

st.subheader("Kept keys")
n_kv = result.kept.shape[1]
options = ([None] if n_kv <= MAX_STACKED else []) + list(range(n_kv))
kv_head = st.selectbox("Key/value head", options, key="kv_head_shown",
                       format_func=lambda g: "all" if g is None else f"key/value head {g}")
show_figure(kept_keys_figure(result, kv_head), f"kv_kept_{press}_{ratio:g}")
csv_button("Kept positions (CSV: layer, kv_head, position)", lambda: rows_to_csv(kept_rows(result)),
           f"kv_kept_{press}_{ratio:g}.csv", "kv_kept_csv")

st.subheader("Retained attention")
st.caption("Each query head's share of the last token's full-cache attention that falls on the keys its key/value "
           "head kept. **Click a head** to open it in the heatmaps.")
show_figure(retained_figure(result, clickable=True), f"kv_retained_{press}_{ratio:g}", key="kv_retained",
            on_select=_open_clicked)
csv_button("Retained attention (CSV, layer x head)", lambda: grid_to_csv(result.retained),
           f"kv_retained_{press}_{ratio:g}.csv", "kv_retained_csv")

st.subheader("Budget sweep")
st.caption("Every policy at compression ratios 0.1 to 0.9: the prefill and each policy's scores once, then one "
           "pass of the last token per budget.")
if cached_sweep.cached(trace, model_id, device_name) or st.button("Run the sweep (5 policies × 9 ratios)",
                                                                 key="kv_run_sweep"):
    with view_guard("budget sweep"):
        swept = cached_sweep(trace, model_id, device_name)
        show_figure(sweep_figure(swept), "kv_sweep")
        csv_button("Sweep (CSV)", lambda: rows_to_csv(swept.to_rows()), "kv_sweep.csv", "kv_sweep_csv")

st.subheader("Needle test")
st.caption(f"A text the team wrote about a harbour town hides one fact; it ends with “{QUESTION.splitlines()[0]}”. "
           f"For each policy and budget the model decodes a few tokens from its compressed cache: ✓ when the answer "
           f"contains “{ANSWER}”. The same for every text you type (it is not your text).")
needle = needle_done(model_id, device_name)
if needle is not None or st.button("Run the needle test", key="kv_run_needle"):
    with view_guard("needle test"):
        needle = needle or run_needle(model_id, device_name)
        show_figure(needle_figure(needle), "kv_needle")
        st.dataframe([{**row, "answer": repr(row["answer"])} for row in needle.to_rows()], hide_index=True)
        csv_button("Needle test (CSV)", lambda: rows_to_csv(needle.to_rows()), "kv_needle.csv", "kv_needle_csv")
