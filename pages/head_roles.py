"""Head roles: which heads are previous-token, duplicate-token, induction, sink and retrieval heads; a click (or a
link) opens the probe's own input in the heatmaps with that head in focus."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import streamlit as st

from model_core.roles import (
    ENCODER_NOTES,
    N_SEQUENCES,
    PROBE_ROLES,
    ROLE_TITLES,
    SEQ_LEN,
)
from model_core.roles.retrieval import DEPTHS
from model_core.io.tables import rows_to_csv
from model_core.roles.probes import top_heads
from ui.analysis_widgets import (
    clicked_cell,
    csv_button,
    how_to_read,
    show_figure,
)
from ui.context import require_trace
from ui.guard import memory_guard
from ui.roles import (
    heatmaps_url,
    long_text_scores,
    model_key,
    probe_scores,
    retrieval,
    text_scores,
)
from ui.roles_figures import role_grid
from ui.focus import set_focus
from ui.run_traces import with_page_traces
from ui.state import head_fragment, open_page_if_requested

HEATMAPS_PAGE = "pages/heatmaps.py"
OPEN_FLAG = "_roles_open_heatmaps"
TOP_K = 10


def _open(layer: int, head: int, text: str) -> None:
    # A callback: it runs before the sidebar is drawn, so it may set the text and the focused head.
    st.session_state["ctl_text_a"], st.session_state["ctl_text_b"] = text, ""
    set_focus(layer, head)
    st.session_state[OPEN_FLAG] = True


def _open_clicked(text: str) -> None:
    cell = clicked_cell("roles_grid")
    if cell is not None:
        _open(*cell, text)


open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)

st.header("Head roles")
ctx = require_trace(compact=True)  # the probe needs no trace of the sidebar's text; a long one is read compact
trace, request = (ctx.trace if ctx.trace is not None else ctx.compact), ctx.request
model = model_key(request)
how_to_read(
    "Each head gets a score between 0 and 1 per role, from inputs built to show that role. The probe: "
    f"{N_SEQUENCES} sequences of {SEQ_LEN} distinct random words of the model's own vocabulary, each written "
    "twice. **Previous-token**: the mean weight a token puts on the token just before it. **Duplicate-token**: "
    "the mean weight a word puts on other copies of itself (a decoder sees the earlier ones). **Induction**: "
    "the mean weight a word of the second copy puts on the word that *followed* it in the first copy, the "
    "diagonal stripe an induction head draws. **Sink**: the mean weight on "
    f"{ctx.markers.first} (position 0). **Retrieval** (decoders): while the model copies a password out of a long text, the "
    "share of the password's tokens at which the head's strongest weight points at the token being copied. "
    "**Click a cell**, or a link in the table, to open the probe's input in the heatmaps with that head in focus.",
    "Olsson et al. (2022), In-context Learning and Induction Heads; TransformerLens's head_detector (previous- "
    "and duplicate-token); Xiao et al. (2023), Attention Sinks; Wu et al. (2024), Retrieval Head "
    "Mechanistically Explains Long-Context Factuality. Protocols: model_core/roles/.",
)
seed = int(st.number_input("Probe seed (draws the random words and the password)", 0, 9999, 0, key="roles_seed"))
try:
    scores = probe_scores(model, seed)
except ValueError as exc:  # RunMemoryError: the probe would not fit AE_RUN_MEMORY_MB (the estimate and the limit)
    st.error(str(exc), icon=":material/memory:")
    st.stop()
probe_text = scores.texts[0]


def _top_table(grid: np.ndarray, role: str) -> None:
    """The top heads of a role, each with a link that opens the probe input in the heatmaps (a new tab)."""
    rows = [{"layer": layer, "head": head, "score": score, "open": heatmaps_url(request, probe_text, layer, head)}
            for layer, head, score in top_heads(grid, TOP_K)]
    st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
        "score": st.column_config.NumberColumn(format="%.3f"),
        "open": st.column_config.LinkColumn("open the probe input in the heatmaps", display_text="open ↗")})


@st.fragment
@memory_guard()  # its own reruns are outside app.py's handler
@with_page_traces  # a rerun of the fragment takes the trace from the cache (ui.run_traces)
def role_view() -> None:
    """The role picker, its grid and its top heads: another role reruns only this part."""
    open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)
    role = st.radio("Role", PROBE_ROLES, format_func=ROLE_TITLES.get, horizontal=True, key="roles_role")
    if role in scores.notes:
        st.caption(scores.notes[role])
    grid = scores.scores[role]
    show_figure(role_grid(grid, role), f"{trace.model_kind}_{role}_heads", key="roles_grid",
                on_select=lambda: _open_clicked(probe_text))
    _top_table(grid, role)


role_view()


def _open_button(layer: int, head: int) -> None:
    """The button that opens the sidebar's focused head on the probe input (in the picker's fragment)."""
    open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)  # the button's click reruns only the fragment
    st.button(f"Open layer {layer}, head {head} on the probe input", key="roles_open", on_click=_open,
              args=(layer, head, probe_text), help="Pick the layer and head in the sidebar.")


head_fragment("roles_head", _open_button, slot=ctx.head_slot, n_layers=trace.n_layers, n_heads=trace.n_heads,
              settings=ctx.settings)

st.subheader("Retrieval heads")
result = None
if not trace.is_decoder:
    st.info(ENCODER_NOTES["retrieval"])
else:
    st.caption(f"Greedy decoding with the KV cache after a needle-in-a-haystack prompt of about 530 tokens, the "
               f"needle at {', '.join(f'{d:.0%}' for d in DEPTHS)} of the text: short enough for a 2-core CPU "
               "(about 10-60 s for SmolLM2-135M; once per model, then cached).")
    if st.toggle("Score retrieval heads", key="roles_retrieval"):
        try:
            result = retrieval(model, seed)
        except ValueError as exc:  # RunMemoryError: the haystack would not fit AE_RUN_MEMORY_MB
            st.error(str(exc), icon=":material/memory:")
            st.stop()
        st.caption(f"Password “{result.secret}”; the model answered {', '.join(repr(a) for a in result.answers)}, "
                   f"copying {sum(result.copied)} of {len(result.copied) * result.answer_tokens} password tokens.")
        show_figure(role_grid(result.scores, "retrieval", clickable=False), f"{trace.model_kind}_retrieval_heads",
                    key="roles_retrieval_grid")
        _top_table(result.scores, "retrieval")

st.subheader("On your text")
if st.toggle("Score the sidebar's text", key="roles_text",
             help="Previous-token, duplicate-token and sink apply to any text. Induction needs a repeated "
                  "sequence: a long text (compact form) is scored on its own repeats too. Retrieval needs a needle, "
                  "so it stays on the probe."):
    mine = text_scores(trace) if ctx.compact is None else long_text_scores(ctx.compact, request)
    role = st.radio("Role on your text", tuple(mine), format_func=ROLE_TITLES.get, horizontal=True,
                    key="roles_text_role")
    if not np.isfinite(mine[role]).any():
        st.caption(f"No word of this text repeats, so no head has a {ROLE_TITLES[role].lower()} score on it.")
    else:
        show_figure(role_grid(mine[role], role, title=f"{ROLE_TITLES[role]} score on your text", clickable=False),
                    f"{trace.model_kind}_{role}_your_text", key="roles_text_grid")

st.subheader("Download")
final = scores if result is None else scores.with_role("retrieval", result.scores)
left, right = st.columns(2)
with left:
    csv_button("Every head's role scores (CSV)", rows_to_csv(final.to_rows()), "head_roles.csv", "roles_csv")
with right:
    st.download_button("Scores, top heads and probe texts (JSON)", json.dumps(final.to_json()), file_name="head_roles.json",
                       mime="application/json", key="roles_json", on_click="ignore")
