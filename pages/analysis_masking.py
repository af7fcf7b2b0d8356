"""Head masking with live effect: switch heads off and see what changes (Michel et al. 2019)."""

from __future__ import annotations

import numpy as np
import streamlit as st

from attention_explorer.analysis_figures import (
    logits_figure,
    masking_hidden_figure,
    next_token_figure,
)
from attention_explorer.figures import layer_head_figure
from model_core.trace.resolve import model_id_of
from model_core.analysis import (
    compare_masking,
    next_token_effect,
)
from model_core.io.export import to_json_str, to_npz_bytes
from model_core.io.tables import grid_to_csv, matrix_to_csv, rows_to_csv
from ui.analysis_widgets import (
    bundle_buttons,
    csv_button,
    how_to_read,
    show_figure,
)
from ui.context import require_trace
from ui.derived import next_token_distribution
from ui.loaders import get_masked_run

OFF_KEY = "mask_off_heads"


def _label(pair: tuple[int, int]) -> str:
    return f"layer {pair[0]} · head {pair[1]}"


st.header("Head masking")
ctx = require_trace()
trace = ctx.trace
readout = ctx.markers.readout_label  # [CLS], or a decoder's last token
predicts = trace.next_token_ids is not None  # a decoder: its next-token prediction is the output to watch
how_to_read(
    "Choose heads to switch off: their output is multiplied by 0 before the output projection (a gate in the "
    "custom encoder, the same gate in every pretrained model's attention), everything else stays the same, and "
    "the same input runs again. "
    + ("**Next token**: the model's top predictions after the last token with all heads on and with the heads "
       "switched off, and how far the whole next-token distribution moved: total variation ½Σ|p−q| (0 = the "
       "same, 1 = disjoint) and KL(p‖q) in bits. " if predicts else
       "**Logits** (custom encoder only; its classifier head is untrained unless you load BERT weights, so "
       "read the size of the change, not the label): the classifier's output with and without the heads. ")
    + f"**{readout[0].upper() + readout[1:]}'s hidden state**: cosine similarity and L2 distance between the two "
    "runs after each layer — flat at 1 / 0 until the first switched-off layer. **Grids**: for every head, how "
    "much its attention "
    "pattern changed (total variation ½Σ|p−q| and JS divergence, averaged over query tokens); heads at or "
    "below the first switched-off layer cannot change, switched-off heads are blank.",
    "Michel, Levy & Neubig (2019), “Are Sixteen Heads Really Better than One?”, NeurIPS; the head gate "
    "follows Voita et al. (2019), ACL.",
)

pairs = [(layer, head) for layer in range(trace.n_layers) for head in range(trace.n_heads)]
# First visit: switch off the head focused in the sidebar, so the page opens on a result.
default_off = [(ctx.layer, ctx.head)] if OFF_KEY not in st.session_state else st.session_state[OFF_KEY]
st.session_state[OFF_KEY] = [p for p in default_off if tuple(p) in set(pairs)]
c1, c2 = st.columns([3, 1])
off = c1.multiselect("Heads to switch off", pairs, format_func=_label, key=OFF_KEY,
                     placeholder="e.g. layer 0 · head 0")
whole = c2.selectbox("…or a whole layer", [None, *range(trace.n_layers)], key="mask_whole_layer",
                     format_func=lambda v: "none" if v is None else f"layer {v}")
off_set = {tuple(p) for p in off} | ({(whole, h) for h in range(trace.n_heads)} if whole is not None else set())
if not off_set:
    st.info("Pick at least one head to switch off; the comparison appears here.")
    st.stop()

masked = get_masked_run(ctx.request, tuple(sorted(off_set)))  # its own spinner, or its place in the queue
effect = compare_masking(trace, masked)

next_token = None
if predicts:
    model_id = model_id_of(ctx.request, ctx.settings)
    next_token = next_token_effect(trace, masked, next_token_distribution(trace, model_id), masked.next_token_probs)
    m1, m2, m3 = st.columns(3)
    m1.metric("Most likely next token", repr(next_token.top_masked),
              f"was {next_token.top_baseline!r}" if next_token.top_changed else None, delta_color="inverse",
              help="With the heads switched off" + ("" if next_token.top_changed else "; the same as with all on."))
    m2.metric("Total variation", f"{next_token.total_variation:.4f}", help="½Σ|p−q| over the whole vocabulary.")
    m3.metric("KL divergence (bits)", f"{next_token.kl_bits:.4f}", help="KL(all heads on ‖ heads switched off).")
    show_figure(next_token_figure(next_token), f"{trace.model_kind}_masking_next_token")
    # repr shows a space or a line break that would print as nothing
    st.dataframe([{**row, "token": repr(row["token"])} for row in next_token.to_rows()], hide_index=True,
                 column_config={"all heads on": st.column_config.NumberColumn(format="%.4f"),
                                "heads switched off": st.column_config.NumberColumn(format="%.4f"),
                                "change": st.column_config.NumberColumn(format="%+.4f")})
elif effect.logits_baseline is not None:
    changed = effect.prediction_changed
    st.metric("Largest logit change", f"{np.abs(effect.logits_delta).max():.4f}",
              "prediction changed" if changed else "same prediction", delta_color="inverse" if changed else "off")
    show_figure(logits_figure(effect), "custom_masking_logits")
else:
    st.caption(f"This {trace.family.label} has no classifier head here, so the effect is read from the "
               f"{readout} hidden state.")
show_figure(masking_hidden_figure(effect), f"{trace.model_kind}_masking_readout_hidden")
left, right = st.columns(2)
with left:
    show_figure(layer_head_figure(effect.attention_tv, "Change of each head's attention (total variation)",
                                  zmin=0.0, colorscale="Reds", colorbar="TV"), f"{trace.model_kind}_masking_tv")
with right:
    show_figure(layer_head_figure(effect.attention_js, "Change of each head's attention (JS, bits)",
                                  zmin=0.0, colorscale="Reds", colorbar="bits"), f"{trace.model_kind}_masking_js")

st.subheader("Download")
d1, d2, d3 = st.columns(3)
with d1:
    csv_button("TV grid (CSV)", grid_to_csv(effect.attention_tv), "masking_tv.csv", "mask_csv_tv")
with d2:
    csv_button("JS grid (CSV)", grid_to_csv(effect.attention_js), "masking_js.csv", "mask_csv_js")
with d3:
    hidden = np.stack([effect.cls_cosine, effect.cls_l2], axis=1)
    csv_button(f"{readout} cosine and L2 (CSV)",
               matrix_to_csv(hidden, [f"layer {i}" for i in range(len(hidden))], ["cosine", "l2"]),
               "masking_readout_hidden.csv", "mask_csv_cls")
if next_token is not None:
    csv_button("Next-token predictions (CSV)", rows_to_csv(next_token.to_rows()), "masking_next_token.csv",
               "mask_csv_next")
arrays = {"masked_heads": effect.masked_heads, "readout_position": effect.position, "cls_cosine": effect.cls_cosine,
          "cls_l2": effect.cls_l2, "attention_tv": effect.attention_tv, "attention_js": effect.attention_js}
if effect.logits_baseline is not None:
    arrays |= {"logits_baseline": effect.logits_baseline, "logits_masked": effect.logits_masked}
if next_token is not None:
    arrays |= {"next_token_ids": next_token.token_ids, "next_token_strings": np.asarray(next_token.strings),
               "next_token_baseline": next_token.baseline, "next_token_masked": next_token.masked,
               "next_token_tv": next_token.total_variation, "next_token_kl_bits": next_token.kl_bits}
bundle_buttons(lambda: (to_npz_bytes(arrays), to_json_str(arrays)), f"{trace.model_kind}_masking", "mask_bundle")
