"""Circuits: edge attribution (EAP, EAP-IG) over a dataset of prompt pairs, the circuit at an edge budget drawn as a
graph, its faithfulness curve with CPR and CMD, each node's share, and the downloads."""

import json

import pandas as pd
import streamlit as st

from attention_explorer.circuits import circuit_graph_figure, faithfulness_figure
from model_core.circuits.eap import CircuitModelError
from model_core.circuits.faithfulness import FRACTIONS
from model_core.circuits.graph import edge_budget
from ui.analysis_widgets import csv_button, how_to_read, show_figure
from ui.circuits import (
    DATASET_PREFIX,
    DEFAULT_COUNT,
    FRACTION_KEY,
    KEPT,
    RUN_KEY,
    STOPPED_KEY,
    circuit_model_of,
    fitted_or_refused,
    head_rows,
    method_fields,
    run,
    time_estimate,
)
from ui.context import require_request
from ui.dataset_fields import (
    checked_pairs,
    pair_counts,
    pair_source,
    run_when_asked,
    show_problems,
)
from ui.patching import model_request
from ui.state import use_bundled_decoder

st.title("Circuits")
# The page runs its own prompt pairs: only the sidebar's model matters, so it reads the request, not its trace.
request = require_request().request
model = model_request(request)
try:
    cm = circuit_model_of(model) if request.model == "pretrained" else None
except CircuitModelError as exc:  # an encoder, a post-norm or a parallel block
    st.info(str(exc), icon=":material/info:")
    st.button("Use SmolLM2-135M-Instruct", on_click=use_bundled_decoder, type="primary")
    st.stop()
except ValueError as exc:  # ModelLoadError: a model id that does not load
    st.error(str(exc), icon=":material/error:")
    st.stop()
if cm is None:
    st.info("Edge attribution compares next-token logits, and an encoder (BERT, the chapter-3 encoder) predicts no "
            "next token: pick a decoder such as SmolLM2 in the sidebar.", icon=":material/info:")
    st.button("Use SmolLM2-135M-Instruct", on_click=use_bundled_decoder, type="primary")
    st.stop()

how_to_read(
    "A **dataset** of prompt pairs (a clean and a corrupted prompt of the same token count, an answer and a foil); "
    "the metric is M = logit(answer) − logit(foil) after the last token. The graph's **nodes** are the input, every "
    "head and every MLP (senders) and every head's query, key and value inputs, every MLP and the logits "
    "(receivers); an **edge** joins a sender to each receiver that reads the residual stream it writes. **EAP** "
    "scores an edge u → v as Σ over positions of (z_u clean − z_u corrupted) · ∂M/∂x_v, averaged over the pairs; "
    "**EAP-IG** averages the gradient over the steps from the corrupted to the clean input. A positive score "
    "carries the clean answer. The **circuit** at a fraction f keeps the top ⌈f·E⌉ edges by |score|; its "
    "**faithfulness** is (m(C) − m(∅)) / (m(N) − m(∅)), m(C) the mean metric with every other edge carrying the "
    "corrupted run's sender output. **CPR** (higher is better) is the area under the faithfulness curve and **CMD** "
    "(lower is better) the area under |1 − faithfulness|, both over the fractions 0.001 to 1 on a linear axis.",
    "Syed et al. (2023), Attribution Patching Outperforms Automated Circuit Discovery; Hanna et al. (2024), Have "
    "Faith in Faithfulness (EAP-IG); Mueller et al. (2025), MIB: a Mechanistic Interpretability Benchmark.",
)
picked = pair_source(DATASET_PREFIX, DEFAULT_COUNT)
if picked is None:
    st.stop()
source_key, dataset = picked
method, steps = method_fields()
checked = checked_pairs(dataset, cm.tokenizer)
if checked is None:
    st.stop()
st.caption(f"{pair_counts(dataset, checked)}{cm.graph.n_edges:,} edges in {cm.n_layers} layers × {cm.n_heads} heads.")
key = (model, source_key, method, steps)
kept_result = KEPT.finished(key)
if kept_result is None:  # before a run: what it will hold and how long it will take, or why it cannot run
    fitted = fitted_or_refused(cm, checked)
    if fitted is None:
        show_problems(checked.messages, "cannot run")
        st.stop()
    show_problems(fitted.problems, "do not fit this server's memory for one run")
    st.caption(time_estimate(key, cm, fitted, steps))
result = run_when_asked(
    KEPT.finished(key), checked, f"Run {method.upper()} on {len(checked.pairs)} pairs", RUN_KEY,
    "Edge scores in batches of pairs, then the faithfulness curve; a Stop keeps the batches finished.",
    lambda: run(key, cm, dataset, method, steps))
if result is None:
    st.info(f"Press **Run** to score every edge on these pairs ({method.upper()}"
            f"{f', {steps} steps' if method == 'eap-ig' else ''}), then the faithfulness curve; the circuit, its curve "
            "and each node's edges are drawn here. On two CPU cores 16 IOI pairs take a minute or two.",
            icon=":material/info:")
    st.stop()

m1, m2, m3, m4 = st.columns(4)
m1.metric("Pairs run", result.n)
m2.metric("Mean clean metric", "n/a" if not result.n else f"{result.clean:+.3f}",
          help="logit(answer) − logit(foil) after each clean prompt, averaged")
m3.metric("Mean corrupted metric", "n/a" if not result.n else f"{result.corrupt:+.3f}")
m4.metric("Method", f"{result.method.upper()}" + (f", {result.steps} steps" if result.method == "eap-ig" else ""))
if result.partial:
    st.warning(f"The run was stopped{' by you' if st.session_state.get(STOPPED_KEY) else ''}: the scores average "
               f"the {result.n} pairs finished" + ("" if result.curve else ", and there is no faithfulness curve")
               + ". Run it again for every pair.", icon=":material/pause_circle:")
show_problems(result.problems, "did not run")
if not result.n:
    st.stop()

fraction = st.select_slider("Edge budget: the fraction of the edges the circuit keeps", options=list(FRACTIONS),
                            value=0.01, key=FRACTION_KEY, format_func=lambda f: f"{f:g}")
keep = result.scores.circuit(fraction)
kept = edge_budget(fraction, cm.graph.n_edges)
at = (f"; faithfulness {result.curve.values[FRACTIONS.index(fraction)]:.3f}" if result.curve is not None else "")
st.caption(f"{kept:,} of {cm.graph.n_edges:,} edges{at}. A head's q, k and v inputs are drawn at the head; hover an "
           "edge for its receiver and score.")
show_figure(circuit_graph_figure(result.scores, fraction), "circuit_graph", key="circ_graph")

if result.curve is not None:
    curve = result.curve
    show_figure(faithfulness_figure(curve), "circuit_faithfulness", key="circ_curve")
    c1, c2, c3, c4 = st.columns(4)
    c1.metric("CPR (linear axis)", f"{curve.cpr:.4f}", help="Σ (f_{i+1} − f_i)(F_i + F_{i+1})/2 over the fractions "
              "0.001 to 1 on a linear axis: higher is better")
    c2.metric("CMD (linear axis)", f"{curve.cmd:.4f}", help="The same area under |1 − F|: lower is better")
    c3.metric("CPR (log axis)", f"{curve.cpr_log:.3f}", help="MIB's code can integrate over ln f instead; shown for "
              "comparison, not the CPR above")
    c4.metric("CMD (log axis)", f"{curve.cmd_log:.3f}")
    st.caption("CPR and CMD are the areas on the linear axis (as the command line prints them); the log-axis "
               "variants are shown beside them. The curve's x axis is drawn on a log scale so the small fractions "
               "can be read.")

st.subheader("Nodes of the circuit")
first = checked.pairs[0].pair.clean
rows = head_rows(result, keep, model, first)
st.dataframe(pd.DataFrame(rows), hide_index=True, width="stretch", column_config={
    "sum_abs_score": st.column_config.NumberColumn("Σ |score| of its edges in the circuit", format="%.4g"),
    "open": st.column_config.LinkColumn("heatmap on the first clean prompt", display_text="open ↗")})

d1, d2 = st.columns(2)
with d1:
    csv_button("Every edge (CSV)", result.edges_csv, "circuit_edges.csv", "circ_csv")
with d2:
    st.download_button("The circuit (JSON)", lambda: json.dumps(result.circuit_json(fraction)),
                       file_name=f"circuit_{fraction:g}.json", mime="application/json", key="circ_json",
                       on_click="ignore")
