"""What the model predicts: a decoder's next tokens at every position, and the logit lens at one of them."""

import streamlit as st

from model_core.analysis.predictions import next_token_rows
from model_core.settings import BUNDLED_DECODER_ID
from model_core.io.tables import rows_to_csv
from ui.analysis_widgets import csv_button, how_to_read, show_figure
from ui.context import require_trace
from ui.derived import trace_key
from ui.guard import view_guard
from ui.loaders import get_logit_lens, pretrained_for, pretrained_key
from attention_explorer.prediction_figures import (TABLE_HEIGHT, final_prediction_figure, logit_lens_figure, prediction_table,
                                   shown_text)
from ui.state import choose_model

ENCODER_MESSAGE = ("BERT and the chapter-3 encoder do not predict next tokens; pick a decoder such as SmolLM2 in the "
                   "sidebar (Model → Pretrained model → SmolLM2-135M-Instruct).")
SHOWN = 5  # predictions per position in the table and the lens (the trace keeps 10; the CSV has them all)
POSITION = "pred_position"

ctx = require_trace()
t = ctx.trace
st.title("What the model predicts")
st.caption(f"{t.description} · {t.n_tokens} tokens")


def _use_decoder() -> None:
    st.session_state["ctl_model"] = "pretrained"
    choose_model(BUNDLED_DECODER_ID)


if not t.is_decoder:
    st.info(ENCODER_MESSAGE, icon=":material/info:")
    st.button("Use SmolLM2-135M-Instruct", on_click=_use_decoder, type="primary")
    st.stop()

loaded = pretrained_for(ctx.request, ctx.settings)  # the cached copy the trace came from
tokens = [loaded.tokenizer.decode([int(i)]) for i in t.token_ids]  # each token as text (" flies", not "Ġflies")
n = t.n_tokens

# The lens starts at the last token (what comes after the whole text), again whenever the text or model changes.
s = st.session_state
if s.get("_pred_trace") != trace_key(t) or s.get(POSITION) not in range(n):
    s[POSITION] = n - 1
    s["_pred_trace"] = trace_key(t)


def _pick_row() -> None:
    """A click on a table row reads the lens at that position (runs before the page, so the picker follows)."""
    rows = s["pred_table"].selection.rows
    if rows:
        s[POSITION] = int(rows[0])


st.subheader("Next-token predictions at every position")
st.caption(f"At each position the model gives every token of its vocabulary a probability of coming next; the "
           f"{SHOWN} most likely are shown, shaded by probability. **next in text** is the token that does come "
           f"next, and **its rank** where the model placed it (>{t.next_token_ids.shape[1]}: not among the "
           "model's top 10). ␣ marks a space, ↵ a line break. Click a row to read it in the logit lens below.")
if ctx.words is not None:
    st.caption("Predictions are made token by token, so this page shows tokens even with words switched on.")
with view_guard("next-token table"):
    st.dataframe(prediction_table(t, SHOWN, tokens), hide_index=True, height=min(TABLE_HEIGHT, 38 + 35 * n),
                 key="pred_table", on_select=_pick_row, selection_mode="single-row")
csv_button("Next-token predictions (CSV, top 10 at every position)", lambda: rows_to_csv(next_token_rows(ctx.trace)),
           "next_token_predictions.csv", "pred_csv")

st.subheader("Logit lens")
position = st.selectbox("Position", range(n), key=POSITION, format_func=lambda i: f"{i}: {shown_text(tokens[i])}",
                        help="The lens reads what the model would predict after this token. Default: the last "
                             "token, whose prediction continues the whole text.")
model_id, device_name = pretrained_key(ctx.request, ctx.settings)
lens = get_logit_lens(t, model_id, device_name, int(position), SHOWN)
st.caption(f"After **{shown_text(tokens[position])}** (position {position}) the model predicts "
           f"**{shown_text(lens.final_string)}** ({lens.final_probs[-1]:.1%}). Each row below reads the residual "
           f"stream after one layer as if it were the last; an outlined cell holds that final prediction.")
show_figure(logit_lens_figure(lens), f"logit_lens_pos{position}", key="lens")
show_figure(final_prediction_figure(lens), f"logit_lens_final_pos{position}", key="lens_final")
csv_button(f"Logit lens at position {position} (CSV)", lambda: rows_to_csv(lens.to_rows()),
           f"logit_lens_pos{position}.csv", "lens_csv")
how_to_read(
    "Row *embeddings* is the token's own embedding; row *layer i* the residual stream after layer *i*. Each is "
    "passed through the model's final norm and unembedding, as the last layer's output is, so each row is the "
    "distribution the model would give if it stopped there. The last row is the model's real prediction (the "
    "table above). Early rows often echo the current token or guess common words; the layer where the final "
    "prediction first takes rank 1 shows where the answer forms. The line below the grid follows the final "
    "prediction's probability through the layers (log scale; its rank on hover).",
    "nostalgebraist (2020), *interpreting GPT: the logit lens*, LessWrong.",
)
