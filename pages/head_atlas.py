"""Head atlas: what every head does across a corpus, each head on one card."""

from __future__ import annotations

import json
import urllib.parse
from pathlib import Path

import streamlit as st

from attention_explorer.atlas import NUMBER_TITLES, NUMBERS, kind_grid_figure, scatter_figure, table_rows
from model_core.atlas import AtlasRunError
from model_core.corpus import CorpusModel
from model_core.io.tables import rows_to_csv
from ui.analysis_widgets import clicked_cell, csv_button, how_to_read, show_figure
from ui.atlas import (
    RUNNING,
    atlas_folder,
    components_section,
    contexts_section,
    open_cached,
    place_section,
    profile_section,
    run_with_progress,
    writes_section,
)
from ui.context import get_context
from ui.corpus import demo_texts, link_params, load_text_and_head, sidebar_model_or_stop
from ui.focus import get_focus, set_focus

OPEN_FLAG = "_atlas_open_page"
TARGET = "_atlas_target_page"

if st.session_state.pop(OPEN_FLAG, False):
    st.switch_page(st.session_state.pop(TARGET, "pages/heatmaps.py"))

st.header("Head atlas")
ctx = get_context()
settings = ctx.settings
how_to_read(
    "What each head does **in general**, not on one sentence: every text of a corpus runs through the sidebar's "
    "model and each head keeps the contexts where it attends most (at most one a text; a decoder's queries from "
    "position 4), samples from each decile of the texts' best weights, and where its weight goes on average (one "
    "token back, the first token, punctuation, another copy of the query's token, the token after an earlier copy: "
    "induction). At its top contexts the **QK split** of *Why this key* says which components raise its scores, and "
    "the **direct logit effect** which tokens its output promotes; the **OV copying score** comes from the weights. "
    "A fixed rule turns these into a one-line summary and a kind. Pick a head on the grid or the scatter. The same "
    "atlas is a CLI command: `python -m model_core atlas --model ... --corpus demo --out DIR` (see the README).",
    "HeadVis (Anthropic); Clark et al. (2019), “What Does BERT Look At?”; Elhage et al. (2021), “A Mathematical "
    "Framework for Transformer Circuits”; Olsson et al. (2022), “In-context Learning and Induction Heads”; Kamath "
    "et al. (2025), QK attributions.",
)

model = sidebar_model_or_stop(ctx.request)
st.caption(f"Model: the sidebar's, {model.label()}.")

source = st.radio("Texts", ["demo", "folder"], horizontal=True, key="atlas_source",
                  format_func={"demo": "Demo corpus", "folder": "Open an atlas folder"}.get)
folder: Path | None = None
corpus = None
if source == "demo":
    corpus, how_many = demo_texts(settings)
    st.caption(f"Short texts the team wrote, {how_many} (ambiguous words in several senses, sentence pairs, "
               "paragraphs), cut at 128 tokens.")
    folder = atlas_folder(settings, model, corpus.fingerprint)
elif not settings.allow_local_models:
    st.info("Opening folders on the server is switched off on this deployment (AE_ALLOW_LOCAL_MODELS=false).")
    st.stop()
else:
    typed = st.text_input("Atlas folder (made by `python -m model_core atlas … --out FOLDER`)", key="atlas_folder")
    if not typed.strip():
        st.stop()
    folder = Path(typed.strip()).expanduser()

run = None
if (folder / "manifest.json").exists():
    try:
        run = open_cached(folder)
    except AtlasRunError as exc:
        st.error(str(exc))
        st.stop()
if corpus is not None and (run is None or not run.complete):
    if run is not None:
        st.info("A partial atlas is kept from a stopped run: Continue runs only what is missing.")
    else:
        st.info("No atlas of this model yet: run it once over the demo corpus, and every head gets its card.")
    label = "Continue the atlas" if run is not None else f"Run the atlas over {len(corpus):,} texts"
    if st.button(label, type="primary", key="atlas_run"):
        run_with_progress(corpus, model, folder)
    st.caption("About a minute for MiniLM and a few minutes for SmolLM2 on two cores. Stop keeps what is done.")
    st.stop()
if run is None or not run.complete:
    st.warning("This folder holds a partial atlas: run the same `atlas` command again to finish it.")
    st.stop()
if run.manifest["model"] != model.key():
    st.warning(f"This atlas was made with {CorpusModel.from_key(run.manifest['model']).label()}; its heads belong to "
               "that model. Switch the sidebar to it to open its heads on the other pages.")

heads = run.heads
n_layers, n_heads = run.shape
kept = get_focus()
focus = (min(kept.layer, n_layers - 1), min(kept.head, n_heads - 1))


def _focus_from_grid() -> None:
    cell = clicked_cell("atlas_grid")
    if cell is not None:
        set_focus(*cell)


def _focus_from_scatter() -> None:
    state = st.session_state.get("atlas_scatter")
    try:
        point = state["selection"]["points"][0]
    except (KeyError, IndexError, TypeError):
        return
    data = point.get("customdata")
    if data is not None:
        set_focus(int(data[0]), int(data[1]))


left, right = st.columns([2, 3])
with left:
    show_figure(kind_grid_figure(heads, n_layers, n_heads, focus=focus), "atlas_kinds", key="atlas_grid",
                on_select=_focus_from_grid)
with right:
    a, b = st.columns(2)
    x = a.selectbox("x axis", NUMBERS, index=NUMBERS.index("induction"), format_func=NUMBER_TITLES.get,
                    key="atlas_x")
    y = b.selectbox("y axis", NUMBERS, index=NUMBERS.index("offset_-1"), format_func=NUMBER_TITLES.get,
                    key="atlas_y")
    show_figure(scatter_figure(heads, x, y, focus=focus), "atlas_scatter", key="atlas_scatter",
                on_select=_focus_from_scatter)

layer, head = focus
card = run.card(layer, head)
st.subheader(f"Layer {layer}, head {head}")
st.markdown(f"**{card['kind']}** — {card['summary']}")

model_key = run.manifest["model"]
top = card["top_contexts_no_sink"][0] if card["top_contexts_no_sink"] else None
text_of = {}
if top is not None and corpus is not None:
    text_of = {"a": corpus.texts[top["text_id"]][0], "b": corpus.texts[top["text_id"]][1]}


def _open(page: str, with_context: bool) -> None:
    if with_context and text_of:
        load_text_and_head(model_key, text_of["a"], text_of["b"], layer, head, OPEN_FLAG)
        if page == "pages/why_this_key.py":
            st.session_state["qk_query"], st.session_state["qk_key"] = top["query"], top["key"]
    else:
        set_focus(layer, head)
        st.session_state[OPEN_FLAG] = True
    st.session_state[TARGET] = page


links = st.columns(4)
for col, (page, title, with_context) in zip(links, (
        ("pages/heatmaps.py", "Attention heatmaps", True), ("pages/why_this_key.py", "Why this key", True),
        ("pages/patching.py", "Patching", False), ("pages/circuits.py", "Circuits", False))):
    col.button(f"Open on {title}", key=f"atlas_open_{title}", on_click=_open, args=(page, with_context),
               help="With the head in focus" + (" and its top context's text in the sidebar" if with_context
                                                and text_of else ""))
if text_of:
    params = {**link_params(model_key), "text_a": text_of["a"], "text_b": text_of["b"] or "", "layer": str(layer),
              "head": str(head)}
    st.caption(f"[Link to the heatmaps on the top context](heatmaps?"
               f"{urllib.parse.urlencode(params, quote_via=urllib.parse.quote)}) (shareable).")

sections = st.tabs(["1 · Top contexts", "2 · Where it looks", "3 · Why it looks there", "4 · What it writes",
                    "5 · Its place among heads", "6 · Summary"])
with sections[0]:
    contexts_section(card)
with sections[1]:
    profile_section(card, layer, head)
with sections[2]:
    components_section(card, int(run.manifest["options"]["qk_contexts"]))
with sections[3]:
    writes_section(card)
with sections[4]:
    place_section(card)
with sections[5]:
    st.markdown(f"**{card['summary']}**")
    st.caption("Made by fixed rules from the numbers above (model_core.atlas.summary): the first that holds names "
               "the kind; no language model.")

st.subheader("Download")
d1, d2 = st.columns(2)
with d1:
    csv_button("Every head's summary and numbers (CSV)", lambda: rows_to_csv(table_rows(heads)), "atlas_heads.csv",
               "atlas_csv")
d2.download_button("The whole atlas (JSON)", lambda: json.dumps({"manifest": run.manifest, "heads": heads}),
                   file_name="atlas.json", mime="application/json", key="atlas_json")
st.caption(f"The atlas folder: {run.path} (manifest.json, parts/, heads.json, cards/).")
st.session_state.pop(RUNNING, None)
