"""Which attention matters: the contribution graph of one token (Ferrando & Voita 2024, "information flow routes"),
each head's contribution beside its attention, and the tokens each block promotes and suppresses."""

from __future__ import annotations

import streamlit as st

from attention_explorer.contributions import (
    HEAD_MAPS_CAPTION,
    graph_figure,
    head_map_rows,
    head_maps_figure,
)
from model_core.io.tables import rows_to_csv
from ui.analysis_widgets import csv_button, how_to_read, show_figure
from ui.context import require_trace
from ui.contributions import (
    block_tokens,
    build,
    cached_flow,
    layer_maps,
    prefetch_lower,
)
from ui.guard import view_guard

TOKEN, THRESHOLD, LAYER, ROW = "pg_graph_token", "pg_graph_threshold", "pg_graph_layer", "pg_graph_row"
LOWEST = 0.01  # model_core.effects.graph.MIN_THRESHOLD: below it every share passes and the graph is the whole model
MAX_ROWS = 40  # query rows the head maps show at once

ctx = require_trace(compact=True)
core = ctx.trace if ctx.trace is not None else ctx.compact
n, n_layers = core.n_tokens, core.n_layers
labels = core.labels
s = st.session_state

st.title("Contributions: which attention matters")
st.caption(f"{core.description} · {n} tokens{' · compact trace' if ctx.trace is None else ''}")
how_to_read(
    "Each node is a token's residual-stream vector at one stage (bottom: the embeddings; then after each layer's "
    "attention and after its MLP). An edge says how much one vector contributed to another: its **proximity "
    "share**, the part's L1 closeness to the whole, normalised over every part. Attention edges come from the "
    "(key token, head) terms αᵢⱼʰ·W_Oʰ·vⱼ; grey edges are the residual, orange the MLP. Shares at or below the "
    "threshold are dropped and each node's survivors renormalised; the graph is built backwards from the chosen "
    "token and keeps only what reaches it. Click a node or an attention edge (or pick a layer) to compare each "
    "head's contribution with its attention: a head that looks hard but contributes little is attention that "
    "does not matter.",
    "Ferrando & Voita (2024), Information Flow Routes; llm-transparency-tool (Meta).")

# Links may carry values outside the widgets' ranges: bring them back before the widgets are made.
if s.get(TOKEN, -1) not in range(-1, n):
    s[TOKEN] = -1
if s.get(LAYER, -1) not in range(-1, n_layers):
    s[LAYER] = -1
if not LOWEST <= float(s.get(THRESHOLD, 0.04)) <= 0.99:
    s[THRESHOLD] = 0.04

left, right = st.columns([2, 1])
with left:
    last = "the last token, the prediction" if core.is_decoder else "the last token"
    token = st.selectbox("Token the graph starts from", range(-1, n), key=TOKEN,
                         format_func=lambda i: f"{labels[i]} ({last})" if i == -1 else f"{i}: {labels[i]}",
                         help="A decoder's graph starts by default at the last token, whose output predicts the next "
                              "token. An encoder has no prediction: pick any token; its graph starts at the top layer.")
with right:
    threshold = st.slider("Threshold", LOWEST, 0.99, step=0.01, key=THRESHOLD,
                          help="Shares at or below it are dropped and each node's survivors renormalised "
                               "(the paper's renormalising threshold). At least 0.01: below it every share passes "
                               "and the graph would be the whole model.")

graph = None
with view_guard("contribution graph"):
    flow = cached_flow(core, ctx.request)
    try:
        graph = build(flow, int(token), float(threshold))
    except ValueError as exc:  # a threshold out of range (from a link): say what to pick
        st.info(str(exc))
        st.stop()
    prefetch_lower(flow, int(token), float(threshold))  # a lower threshold's nodes, computed while the page is read


def _pick_layer() -> None:
    """A click on a node or an attention edge opens its layer below (runs before the next run of the page)."""
    try:
        point = s["graph_chart"]["selection"]["points"][0]
        s[LAYER] = int(point["customdata"][0])
    except (KeyError, IndexError, TypeError, ValueError):
        pass


if graph is None:
    st.stop()
if graph.n_edges == 0:
    st.info(f"No share is above the threshold {threshold:g} at the start node: lower the threshold to see a graph.")
else:
    st.caption(f"{len(graph.nodes())} nodes and {graph.n_edges} edges; only the nodes the graph reaches are drawn.")
    show_figure(graph_figure(graph, labels), f"contribution_graph_{graph.token}", key="graph_chart",
                on_select=_pick_layer)
left, right = st.columns(2)
with left:
    st.download_button("Graph (JSON)", lambda: graph.dumps(), file_name=f"contribution_graph_{graph.token}.json",
                       mime="application/json", key="graph_json", on_click="ignore")
with right:
    csv_button("Edges (CSV)", lambda: rows_to_csv(graph.edge_rows()), f"contribution_edges_{graph.token}.csv",
               "graph_csv")

st.subheader("One layer: contribution beside attention")
# The graph's layer to open (pg_graph_layer), not the sidebar's focused head: the head maps below show every head.
layer = st.selectbox("Layer to open", range(-1, n_layers), key=LAYER,
                     format_func=lambda la: "(click a node or an edge, or pick one)" if la == -1 else f"layer {la}")
if layer == -1:
    st.stop()
rows = graph.positions(layer)
if not rows:
    st.info(f"No node of the graph is at layer {layer} after its attention: pick another layer or lower the "
            "threshold.")
    st.stop()
if len(rows) > MAX_ROWS:
    st.caption(f"The graph reaches {len(rows)} query rows at this layer; the {MAX_ROWS} nearest the start token are "
               "shown.")
    rows = sorted(sorted(rows, key=lambda p: abs(p - graph.token))[:MAX_ROWS])
with view_guard("head maps"):
    contrib, weights = layer_maps(flow, layer, rows)
    st.caption("Rows: the graph's query tokens at this layer; columns: key tokens (at most 120: those with the "
               "largest attention or contribution). " + HEAD_MAPS_CAPTION)
    show_figure(head_maps_figure(contrib, weights, rows, labels, layer), f"head_maps_layer{layer}", key="head_maps")
    csv_button("Head maps (CSV: contribution and attention)",
               lambda: rows_to_csv(head_map_rows(contrib, weights, rows, labels, layer)),
               f"contribution_head_maps_layer{layer}.csv", "graph_head_maps_csv")

st.subheader("What each block writes")
if not core.is_decoder:
    st.info("An encoder has no unembedding, so its blocks promote no tokens; the graph above works all the same.")
    st.stop()
if s.get(ROW) not in rows:
    s[ROW] = graph.token if graph.token in rows else rows[-1]
position = st.selectbox("Position", rows, key=ROW, format_func=lambda p: f"{p}: {labels[p]}")
with view_guard("promoted tokens"):
    attention, mlp = block_tokens(flow, ctx.request, layer, int(position))
    st.caption("Each block's output at this position through the final norm (its scale frozen at the residual "
               "after the block) and the unembedding: the tokens whose logits it raises most and lowers most.")
    for column, found, name in zip(st.columns(2), (attention, mlp), ("Attention block", "MLP block")):
        with column:
            st.markdown(f"**{name}**, layer {layer}")
            st.dataframe(found.rows(), hide_index=True)
            csv_button(f"{name} tokens (CSV)", rows_to_csv(found.rows()),
                       f"{found.block}_tokens_layer{layer}_pos{found.position}.csv", f"graph_tokens_csv_{found.block}")
