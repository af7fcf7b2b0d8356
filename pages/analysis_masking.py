"""Head masking with live effect: switch heads off and see what changes (Michel et al. 2019)."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import streamlit as st

from model_core.analysis import compare_masking, grid_to_csv, head_mask_from_off, matrix_to_csv, to_json_str, to_npz_bytes
from ui.analysis_figures import logits_figure, masking_hidden_figure
from ui.analysis_widgets import bundle_buttons, csv_button, figure_format, how_to_read, show_figure
from ui.context import require_trace
from ui.figures import layer_head_figure
from ui.loaders import get_trace

OFF_KEY = "mask_off_heads"


def _label(pair: tuple[int, int]) -> str:
    return f"layer {pair[0]} · head {pair[1]}"


st.header("Head masking")
ctx = require_trace()
trace = ctx.trace
how_to_read(
    "Choose heads to switch off: their output is multiplied by 0 (a gate in the custom encoder, a hook on "
    "BERT's self-attention), everything else stays the same, and the same input runs again. "
    "**Logits** (custom encoder only; its classifier head is untrained unless you load BERT weights, so "
    "read the size of the change, not the label): the classifier's output with and without the heads. "
    "**[CLS] hidden state**: cosine similarity and L2 distance between the two runs after each layer — "
    "flat at 1 / 0 until the first switched-off layer. **Grids**: for every head, how much its attention "
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

mask = head_mask_from_off(trace.n_layers, trace.n_heads, sorted(off_set))
with st.spinner("Running the model with the heads switched off…"):
    masked = get_trace(replace(ctx.request, head_mask=tuple(map(tuple, mask.tolist()))))
effect = compare_masking(trace, masked)

figure_format()
if effect.logits_baseline is not None:
    changed = effect.prediction_changed
    st.metric("Largest logit change", f"{np.abs(effect.logits_delta).max():.4f}",
              "prediction changed" if changed else "same prediction", delta_color="inverse" if changed else "off")
    show_figure(logits_figure(effect), "custom_masking_logits")
else:
    st.caption("Pretrained BERT here has no classifier head, so the effect is read from the [CLS] hidden state.")
show_figure(masking_hidden_figure(effect), f"{trace.model_kind}_masking_cls_hidden")
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
    csv_button("[CLS] cosine and L2 (CSV)",
               matrix_to_csv(hidden, [f"layer {i}" for i in range(len(hidden))], ["cosine", "l2"]),
               "masking_cls_hidden.csv", "mask_csv_cls")
arrays = {"masked_heads": effect.masked_heads, "cls_cosine": effect.cls_cosine, "cls_l2": effect.cls_l2,
          "attention_tv": effect.attention_tv, "attention_js": effect.attention_js}
if effect.logits_baseline is not None:
    arrays |= {"logits_baseline": effect.logits_baseline, "logits_masked": effect.logits_masked}
bundle_buttons(lambda: (to_npz_bytes(arrays), to_json_str(arrays)), f"{trace.model_kind}_masking", "mask_bundle")
