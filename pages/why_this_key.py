"""Why this key: the focused head's score at a (query, key) split into the components that wrote the query and the
key, why this key rather than another, the row view, and composition scores from the weights."""

from urllib.parse import urlencode

import numpy as np
import streamlit as st

from model_core.qk.describe import component_label, describe_pairs, role_labels
from ui.analysis_widgets import csv_button, how_to_read, show_figure
from ui.composition import cached_composition, model_key, render_composition
from ui.context import require_trace
from ui.focus import focus_chosen, request_focus, set_focus
from ui.guard import view_guard
from ui.qk import (
    INDUCTION_TEXT,
    bars_figure,
    cached_qk,
    induction_scores,
    opening_head,
    row_csv,
    row_figure,
    terms_csv,
    terms_figure,
)
from ui.roles import model_key as roles_model_key
from ui.roles import probe_scores
from ui.state import open_page_if_requested, use_bundled_decoder

OPEN_FLAG = "_qk_open_heatmaps"
EXAMPLE_FLAG = "_qk_example"
OPENED_KEY = "_qk_opened"  # the request the page last opened on a head of its own choosing (``opening_head``)


def _load_example() -> None:
    use_bundled_decoder()  # the pretrained model, the bundled decoder, whatever the sidebar had
    st.session_state["ctl_text_a"], st.session_state["ctl_text_b"] = INDUCTION_TEXT, ""
    st.session_state[EXAMPLE_FLAG] = True


def _open(layer: int, head: int) -> None:
    set_focus(layer, head)
    st.session_state[OPEN_FLAG] = True


def _head_url(layer: int, head: int) -> str:
    params = {k: st.query_params[k] for k in st.query_params}
    return "heatmaps?" + urlencode({**params, "layer": layer, "head": head})


def _repeat_period(ids: np.ndarray) -> int | None:
    """The period of a repeated token sequence (most tokens equal the token ``period`` earlier), or None."""
    n = len(ids)
    best, best_p = 0.0, None
    for p in range(2, n // 2 + 1):
        same = float(np.mean(ids[p:] == ids[:n - p]))
        if same > best:
            best, best_p = same, p
    return best_p if best >= 0.6 else None


open_page_if_requested(OPEN_FLAG, "pages/heatmaps.py")
st.title("Why this key")
st.caption("An attention score s = q·k × scale, split into the components that wrote the query and the key: the "
           "embeddings, every earlier head and MLP. The focused head comes from the sidebar.")
st.button("Load the ready example: a sentence said twice, on SmolLM2, its strongest induction head in focus",
          on_click=_load_example, key="qk_example")
ctx = require_trace(compact=True)
t = ctx.trace if ctx.trace is not None else ctx.compact
n = int(t.n_tokens)
# The split is of one token's query and one token's key: tokens, even where the sidebar shows words elsewhere
labels = list(ctx.trace.tokens) if ctx.trace is not None else [str(x) for x in range(n)]
if ctx.words is not None:
    st.caption("This page splits one token's score against one token: it reads tokens even with the sidebar's "
               "words on.")

# app.py drew the sidebar's picker before this page ran, so a head chosen here is requested for the next run
# (``request_focus``), which sets it before the picker is drawn; the query and key pickers are not drawn yet.
if st.session_state.pop(EXAMPLE_FLAG, False) and ctx.trace is not None:
    period = _repeat_period(np.asarray(t.token_ids))
    if period is not None:
        scores = induction_scores(np.asarray(t.weights), period)
        layer, head = np.unravel_index(int(np.argmax(scores)), scores.shape)
        request_focus(int(layer), int(head))
        st.session_state["qk_query"] = n - 2  # a token of the repeat, whose next token the head looks up
        st.session_state.pop("qk_key", None)  # its default: the key the head attends to most
        st.session_state[OPENED_KEY] = ctx.key
        st.rerun()

opening = None
if not focus_chosen():  # the focus is the default, not the user's: open where the split has something to explain
    opening = opening_head(t)
    if st.session_state.get(OPENED_KEY) != ctx.key:  # once per text: then the query and key are the user's
        st.session_state[OPENED_KEY] = ctx.key
        st.session_state["qk_query"] = opening.query
        for name in ("qk_key", "qk_versus"):  # their defaults (None, shown as "the one it attends to most" and
            st.session_state.pop(name, None)  # "the runner-up"; a None set here would show as no choice)
        if not opening.top:
            st.session_state["qk_key"] = opening.key
    if (ctx.layer, ctx.head) != (opening.layer, opening.head):
        request_focus(opening.layer, opening.head, chosen=False)
        st.rerun()
    st.caption(f"Opened on layer {opening.layer} head {opening.head}: {opening.reason}. Pick another head in the "
               "sidebar.")

layer, head = ctx.layer, ctx.head
decoder = bool(t.is_decoder)
options = list(range(n))
fmt = lambda i: f"{i}: {labels[i]!r}" if i < len(labels) else str(i)
left, mid, right = st.columns(3)
if st.session_state.get("qk_query") not in range(n):  # a first visit, or a shorter text than the last
    st.session_state["qk_query"] = n - 1 if decoder else 0  # (set here, not by index=, as the example sets it)
query = left.selectbox("Query token", options, format_func=fmt, key="qk_query",
                       help="The token that attends (a row of the heatmap). Default: the last token of a decoder.")
visible = list(range(query + 1)) if decoder else options
key_opts = [None] + visible
key = mid.selectbox("Key token", key_opts, format_func=lambda i: "the one it attends to most" if i is None else fmt(i),
                    key="qk_key", help="The token attended to (a column). A decoder's query sees keys up to itself.")
versus = right.selectbox("Compared with", key_opts, format_func=lambda i: "the runner-up" if i is None else fmt(i),
                         key="qk_versus", help="A second key: why the first rather than this one.")
if key is not None and versus is not None and key == versus:
    st.warning("Pick two different keys to compare.", icon=":material/warning:")
    st.stop()
row = st.toggle("Row view: every key's score split by component", value=n <= 1024, key="qk_row",
                help="Each component's key-side share of the score at every key the query sees. At thousands of "
                     "tokens it holds a (component × key × d_head) block, so it is off by default there.")
try:
    result = cached_qk(t, ctx.request, layer, head, int(query), key, versus, bool(row))
except ValueError as exc:
    st.warning(str(exc), icon=":material/warning:")
    st.stop()

k, v = result.key, result.versus
st.subheader(f"Layer {layer}, head {head}: {fmt(result.query)} → {fmt(k)}")
cols = st.columns(4)
cols[0].metric("score s", f"{result.score:+.3f}")
cols[1].metric("weight a", f"{result.weight:.3f}")
if v is not None:
    cols[2].metric(f"vs key {v.key}", f"{v.score:+.3f}", help=f"weight {v.weight:.3f}")
    cols[3].metric("log(a/a′) = s − s′", f"{v.log_odds:+.3f}")
if result.softcap is not None:
    st.info(f"This model caps its scores (softcap {result.softcap:g}·tanh(s/{result.softcap:g})), which is not "
            f"linear: the split is of the score before the cap ({result.score:+.3f}; capped "
            f"{result.capped_score:+.3f}). The log-odds are of the capped scores and are not split.",
            icon=":material/info:")
roles = None
if st.toggle("Name heads by their roles", key="qk_roles",
             help="Scores every head once per model on repeated random sequences (the Head roles page's probe) and "
                  "names a head for its strongest role where that scores at least 0.4."):
    roles = role_labels(probe_scores(roles_model_key(ctx.request), 0).scores)
st.markdown("\n".join(f"- {line}" for line in describe_pairs(result, result.terms, result.score, 3, roles)))
st.caption(f"Check: the {len(result.components)}² terms sum to {float(result.terms.sum()):+.5f}; the model's score "
           f"is {result.score:+.5f}.")

tab_terms, tab_vs, tab_row = st.tabs(["Query × key components", "Why this key and not that one", "Row view"])
with tab_terms:
    by_layer = st.toggle("Group each layer's heads", value=len(result.components) > 40, key="qk_by_layer",
                         help="Sum each layer's heads into one row and one column (the MLPs stay apart); off: every "
                              "head on its own.")
    with view_guard("terms"):
        show_figure(terms_figure(result, result.terms, "terms[query component][key component]", by_layer=by_layer),
                    f"qk_terms_L{layer}_H{head}", key="qk_terms_fig")
    a, b = st.columns(2)
    with a, view_guard("key side"):
        show_figure(bars_figure(result, result.key_side, "Key side: what makes this key attractive"),
                    "qk_key_side", key="qk_key_bars")
    with b, view_guard("query side"):
        show_figure(bars_figure(result, result.query_side, "Query side: what the query looks for with"),
                    "qk_query_side", key="qk_query_bars")
    csv_button("Terms (CSV)", lambda: terms_csv(result, result.terms), f"qk_terms_L{layer}_H{head}.csv",
               key="qk_terms_csv")
with tab_vs:
    if v is None:
        st.info("The query sees a single key: there is nothing to compare.")
    else:
        diff = result.terms - v.terms
        st.markdown(f"s − s′ = **{result.score - v.score:+.3f}** (key {fmt(k)} against key {fmt(v.key)}):")
        st.markdown("\n".join(f"- {line}" for line in describe_pairs(result, diff, result.score - v.score, 3, roles)))
        with view_guard("versus"):
            show_figure(bars_figure(result, diff.sum(axis=0), "Key side of s − s′"), "qk_versus_key",
                        key="qk_versus_bars")
            show_figure(terms_figure(result, diff, "terms of s − s′", by_layer=by_layer), "qk_versus_terms",
                        key="qk_versus_fig")
        csv_button("Terms of s − s′ (CSV)", lambda: terms_csv(result, diff), f"qk_versus_L{layer}_H{head}.csv",
                   key="qk_versus_csv")
with tab_row:
    if result.row is None:
        st.info("Switch the row view on above.")
    else:
        st.caption("Each component's key-side share of the score at every key the query sees (the query whole). An "
                   "induction head's row follows a previous-token head's writes at the keys: K-composition.")
        with view_guard("row"):
            show_figure(row_figure(result, labels), f"qk_row_L{layer}_H{head}", key="qk_row_fig")
        csv_button("Row view (CSV)", lambda: row_csv(result), f"qk_row_L{layer}_H{head}.csv", key="qk_row_csv")

heads = [c for c in result.components if c.startswith("L") and "H" in c]
if heads:
    order = sorted(heads, key=lambda c: -abs(float(result.key_side[result.components.index(c)])))
    pick_col, go_col = st.columns([3, 1])
    pick = pick_col.selectbox("Open a component's head on the heatmaps", order[:30], key="qk_open_pick",
                              format_func=lambda c: component_label(c, roles))
    layer_h, head_h = (int(x) for x in pick[1:].split("H"))
    go_col.button("Open", on_click=_open, args=(layer_h, head_h), key="qk_open_btn")

how_to_read(
    "The residual stream entering the layer is a sum of parts. With the norm before attention frozen at the whole "
    "residual's scale (and every other norm at its own input), the query and the key are sums of the parts' "
    "images, so the score is a sum of terms, one per (query component, key component). A large positive term says "
    "*this* writer at the query, read through W_Q, matches *that* writer at the key, read through W_K. The rotary "
    "embedding is applied to each part at its own position; the constant biases (b_Q, b_K, a LayerNorm's β, earlier "
    "output biases) are one component, `bias`, where the model has any.",
    "Kamath et al. (2025), QK attributions; Elhage et al. (2021), A Mathematical Framework for Transformer Circuits")

with st.expander("Composition scores: which earlier heads this model's heads can read, from the weights alone"):
    if st.toggle("Compute composition scores for every pair of heads", key="qk_comp_on"):
        try:
            render_composition(cached_composition(model_key(ctx.request)), key="qk_comp", open_url=_head_url)
        except ValueError as exc:
            st.warning(str(exc), icon=":material/warning:")
