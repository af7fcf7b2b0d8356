"""Query–key space (AttentionViz) and nearest contexts (exBERT) over the corpus run the Corpus page opened."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import streamlit as st

from model_core.corpus import CorpusRunError
from model_core.corpus.neighbours import neighbours_of
from model_core.corpus.qk_space import METHODS
from ui.analysis_widgets import how_to_read, show_figure
from ui.context import get_context
from ui.derived import neighbours_by_layer
from ui.focus import get_focus, set_focus
from ui.state import head_fragment, open_page_if_requested
from ui.corpus import (
    CANCELLED,
    demo_texts,
    OPEN_RUN,
    cached_layer_grid,
    cached_projection,
    load_text_and_head,
    open_cached,
    page_options,
    run_folder,
    run_with_progress,
    sample_contexts,
    sidebar_model_or_stop,
)
from ui.corpus_figures import (
    layer_trend_figure,
    neighbour_words_figure,
    qk_grid_figure,
    qk_scatter_figure,
    scatter_point_row,
)

HEATMAPS_PAGE = "pages/heatmaps.py"
OPEN_FLAG = "_space_open_heatmaps"

open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)

st.header("Query–key space & nearest contexts")
ctx = get_context()
how_to_read(
    "**Query–key space.** Every sampled corpus token gives each head a query (what it looks for) and a key (what "
    "it offers). Both clouds are drawn in one plane: the keys are first moved so that their centre is the queries' "
    "centre and both are scaled to the same mean length, which changes no attention weight (AttentionViz), so a "
    "query lies near the keys it attends to. Blue circles are queries, red crosses keys; hover for the token in its "
    "text, **click a point** to open its text in the heatmaps with this head in focus. The grid below shows every "
    "head of the layer at once: clusters, lines and separate clouds mark structured heads.\n\n"
    "**Nearest contexts.** Pick a token of the sidebar's text: the corpus tokens whose hidden state at a layer is "
    "closest (cosine, exact FAISS search) are listed with their texts. At layer 0 (the embeddings) a word finds "
    "itself in any sense; later layers separate the senses (try *bank* in \"we sat on the river bank\").",
    "Yeh, Chen, Wang, Hu, Wattenberg & Viégas (2023), “AttentionViz: A Global View of Transformer Attention”; "
    "Hoover, Strobelt & Gehrmann (2020), “exBERT”.",
)

model = sidebar_model_or_stop(ctx.request)

# The run: the one the Corpus page shows, else the demo corpus with the sidebar's model (run here if needed).
path = st.session_state.get(OPEN_RUN)
run = None
if path and (Path(path) / "manifest.json").exists():
    try:
        run = open_cached(path)
    except CorpusRunError:
        run = None
if run is None or run.manifest["model"] != model.key() or not (run.manifest.get("sample") or {}).get("index"):
    demo, how_many = demo_texts(ctx.settings)
    options = page_options(ctx.settings, "truncate")
    folder = run_folder(ctx.settings, model, demo.fingerprint, options)
    done = (folder / "head_stats.npz").exists() and open_cached(folder).complete
    if not done:
        st.caption("No corpus run with this model is open on the Corpus statistics page, so this page runs the demo "
                   f"corpus ({how_many}) first.")
        if str(folder) in st.session_state.get(CANCELLED, set()):
            if not st.button("Resume the demo run", type="primary", key="space_resume"):
                st.stop()
        run_with_progress(demo, model, folder, options, resume=(folder / "manifest.json").exists())
    run = open_cached(folder)
sample = run.manifest.get("sample") or {}
if not sample.get("queries_keys") or not sample.get("index"):
    st.info("This run kept no token sample. Run it again with `--qk --index` (the Corpus page's runs always do).")
    st.stop()
stamp = (run.path / "manifest.json").stat().st_mtime
n_layers, n_heads = run.shape
st.caption(f"Run: {run.manifest['corpus']['name']} · {run.n_texts:,} texts · {sample['tokens']:,} sampled tokens "
           f"(cap {sample['cap']:,}) · {run.manifest['model_description']}")
contexts = sample_contexts(str(run.path), stamp, json.dumps(run.manifest["model"]))

# -- 1. query–key space ---------------------------------------------------------------------------------------
st.subheader("Query–key space")


def _open_point(key: str, layer: int, head: int, is_key: np.ndarray, rows: np.ndarray) -> None:
    points = ((st.session_state.get(key) or {}).get("selection") or {}).get("points") or []
    if not points or points[0].get("point_index") is None:
        return
    row = int(rows[scatter_point_row(is_key, int(points[0].get("curve_number", 0)), int(points[0]["point_index"]))])
    text_id = int(contexts["text_ids"][row])
    texts = run.texts()
    i = int(np.nonzero(texts["text_id"].to_numpy() == text_id)[0][0])
    load_text_and_head(run.manifest["model"], texts["text_a"][i].as_py(), texts["text_b"][i].as_py(), layer, head,
                       OPEN_FLAG)


def qk_scatter(layer: int, head: int) -> None:
    """The colour, projection and sample pickers and the scatter of one head."""
    c3, c4, c5 = st.columns(3)
    n_sample = int(sample["tokens"])
    choices = sorted({n for n in (2_000, 5_000, 10_000) if n < n_sample} | {n_sample})
    shown = c5.select_slider("Tokens drawn", choices, value=min(10_000, n_sample), key="space_shown",
                             format_func=lambda n: f"{n:,}" + (" (all)" if n == n_sample else ""),
                             help="Each token is a query and a key. The projection always uses the whole sample; "
                                  "drawing fewer points keeps a head change quick.")
    colour_by = c3.radio("Colour", ["kind", "position", "type", "text"], horizontal=True, key="space_colour",
                         format_func={"kind": "query / key", "position": "position", "type": "sentence A/B",
                                      "text": "text"}.get)
    method = c4.radio("Projection", METHODS, horizontal=True, key="space_method", format_func=str.upper,
                      help="PCA is deterministic and fast; UMAP and t-SNE (seeded) need umap-learn / scikit-learn.")
    try:
        proj = cached_projection(str(run.path), stamp, layer, head, n_heads, method)
    except ValueError as exc:
        st.warning(str(exc))
        proj = cached_projection(str(run.path), stamp, layer, head, n_heads, "pca")
    if shown < n_sample:  # a fixed subsample of tokens: the same points for every head
        keep_rows = np.sort(np.random.default_rng(0).choice(n_sample, size=shown, replace=False))
        keep = np.isin(proj.rows, keep_rows)
        proj = type(proj)(proj.coords[keep], proj.is_key[keep], proj.rows[keep], proj.method)
    colours = {"kind": None, "position": contexts["positions"], "type": contexts["types"],
               "text": contexts["text_ids"]}
    colour = colours[colour_by]
    hover = [contexts["hover"][r] for r in proj.rows]
    fig = qk_scatter_figure(proj.coords, proj.is_key, hover, None if colour is None else colour[proj.rows],
                            f"Layer {layer}, head {head}: {len(proj.rows) // 2:,} queries and keys ({method.upper()})",
                            colour_title=colour_by)
    show_figure(fig, f"qk_space_L{layer}H{head}", key="space_scatter",
                on_select=lambda: _open_point("space_scatter", layer, head, proj.is_key, proj.rows))


def _enlarge() -> None:
    points = ((st.session_state.get("space_grid") or {}).get("selection") or {}).get("points") or []
    if points and points[0].get("curve_number") is not None:
        set_focus(get_focus().layer, int(points[0]["curve_number"]) // 2)  # two traces per head


def qk_views(layer: int, head: int) -> None:
    """The scatter of the sidebar's focused head and the grid of every head of its layer (in the picker's
    fragment: another head, colour or projection reruns only this part)."""
    open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)  # a click on a point (its callback ran before this rerun)
    qk_scatter(layer, head)
    grid = cached_layer_grid(str(run.path), stamp, layer, n_heads)
    show_figure(qk_grid_figure([g.coords for g in grid], [g.is_key for g in grid], layer), f"qk_grid_L{layer}",
                key="space_grid", on_select=_enlarge)


head_fragment("space_head", qk_views, slot=ctx.head_slot, n_layers=n_layers, n_heads=n_heads, settings=ctx.settings)

# -- 2. nearest contexts --------------------------------------------------------------------------------------
st.subheader("Nearest contexts")
trace = ctx.trace
if trace is None and ctx.compact is not None:  # a long input keeps no hidden states to compare
    from ui.compact import full_trace_tokens

    c = ctx.compact
    st.info(f"The sidebar's text has {c.n_tokens:,} tokens, so it is traced in compact form, which keeps no hidden "
            "states: the nearest contexts need a full trace, of up to "
            f"{full_trace_tokens(c.n_layers, c.n_heads, ctx.settings.full_trace_mb):,} tokens for this model "
            f"(AE_FULL_TRACE_MB = {ctx.settings.full_trace_mb}). Shorten the text to pick a token from it.")
    st.stop()
if trace is None:
    st.info(ctx.error or "Type a sentence in the sidebar to pick a token from it.")
    st.stop()
if run.manifest["model"] != model.key():
    st.info("The sidebar's model is not this run's model, so its tokens cannot be compared with the corpus.")
    st.stop()
n1, n2, n3 = st.columns([2, 2, 1])
default = next((i for i, t in enumerate(trace.tokens) if t not in ("[CLS]", "[SEP]")), 0)
labels = trace.labels  # the picker keeps its format_func beyond the run, when the page's globals hold no trace
position = n1.selectbox("Token of the sidebar's text", range(trace.n_tokens), index=default, key="space_position",
                        format_func=lambda i: f"{i}: {labels[i]}")
n_hidden = trace.hidden_states.shape[0]
nb_layer = n2.slider("Layer (0 = embeddings)", 0, n_hidden - 1, n_hidden - 1, key="space_nb_layer")
k = n3.number_input("k", 1, 100, 10, key="space_k")
try:
    found = neighbours_of(run, trace.hidden_states, trace.tokens, position=position, layer=nb_layer, k=int(k))
except (CorpusRunError, ValueError) as exc:
    st.error(str(exc))
    st.stop()
word = trace.tokens[position]
left, right = st.columns([3, 2])
with left:
    st.markdown(f"**Nearest to `{word}` (position {position}) at layer {nb_layer}**")
    st.dataframe({"cosine": [round(f["score"], 4) for f in found], "token": [f["token"] for f in found],
                  "text": [f["text"] + (f"  ‖  {f['text_b']}" if f["text_b"] else "") for f in found],
                  "text id": [f["text_index"] for f in found], "position": [f["position"] for f in found]},
                 hide_index=True, width="stretch")
with right:
    show_figure(neighbour_words_figure([f["token"] for f in found], f"Which words the {len(found)} nearest are"),
                "neighbour_words")


same, score, tops = neighbours_by_layer(trace, str(run.path), stamp, position, int(k))
t1, t2 = st.columns([2, 3])
with t1:
    show_figure(layer_trend_figure(same, score, word), "neighbours_by_layer")
with t2:
    st.markdown("**The three nearest at every layer**")
    st.dataframe({"layer": list(range(len(tops))), "nearest": tops}, hide_index=True, width="stretch")
