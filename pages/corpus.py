"""Corpus statistics: Clark et al.'s head statistics over many texts, and a pattern type per head."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import streamlit as st

from model_core.analysis import STAT_NAMES, STAT_TITLES
from model_core.io.tables import rows_to_csv
from model_core.corpus import (
    CorpusInputError,
    CorpusModel,
    CorpusRunError,
    PatternRules,
    read_hub_dataset,
    read_upload,
    table_columns,
)
from model_core.corpus.sources import FILE_KINDS
from model_core.roles import PROBE_ROLES, ROLE_TITLES
from ui.analysis_widgets import clicked_cell, csv_button, how_to_read, show_figure
from ui.context import get_context
from ui.corpus import (
    CANCELLED,
    demo_texts,
    JUST_RAN,
    RUNNING,
    OPEN_RUN,
    load_text_and_head,
    open_cached,
    page_options,
    run_folder,
    run_with_progress,
    sidebar_model_or_stop,
    sidebar_state,
    text_link,
)
from ui.corpus_figures import pattern_figure, corpus_stat_figure
from ui.roles import model_key as roles_model_key
from ui.roles import probe_scores
from ui.roles_figures import mean_by_pattern, role_pattern_figure
from ui.focus import get_focus, set_focus
from ui.state import open_page_if_requested

HEATMAPS_PAGE = "pages/heatmaps.py"
OPEN_FLAG = "_corpus_open_heatmaps"
SOURCES = {"demo": "Demo corpus", "upload": "Upload a file", "hub": "Hugging Face dataset", "folder": "Open a run folder"}

open_page_if_requested(OPEN_FLAG, HEATMAPS_PAGE)

st.header("Corpus statistics")
ctx = get_context()
settings = ctx.settings
how_to_read(
    "One sentence is noise; a corpus shows what a head does. Every text runs through the sidebar's model, in "
    "padded, length-sorted batches, and each head's **Head statistics** (entropy; share to the first token "
    "([CLS] in an encoder), the special tokens ([SEP]), punctuation, self, previous and next token; A→B and B→A for "
    "pairs) are kept **per text**. The grid shows "
    "their **mean over texts** (each text counts once) or their **standard deviation**. The **pattern type** sorts "
    "heads into vertical, diagonal, block and heterogeneous with the thresholds shown below it: a heuristic after "
    "Kovaleva et al., not their classifier. **Click a head** for the texts where its statistic is highest and "
    "lowest; click a text to open it in the heatmaps with that head in focus. The same run is a CLI command: "
    "`python -m model_core corpus --input FILE --model bert --out RUN` (see the README), and this page opens "
    "its folder.",
    "Clark, Khandelwal, Levy & Manning (2019), “What Does BERT Look At?”; Kovaleva, Romanov, Rogers & "
    "Rumshisky (2019), “Revealing the Dark Secrets of BERT”, EMNLP.",
)

model = sidebar_model_or_stop(ctx.request)
st.caption(f"Model: the sidebar's, {model.label()}.")
cap = settings.corpus_max_texts


# -- the texts ---------------------------------------------------------------------------------------
@st.cache_data(max_entries=4, show_spinner="Reading the dataset…")
def _hub_corpus(dataset_id: str, split: str, column: str | None, pair: str | None, limit: int):
    return read_hub_dataset(dataset_id, split=split, column=column, pair_column=pair, limit=limit)


def _choose_texts():
    """(corpus, None) for texts to run, (None, folder) for a run folder to open, or (None, None)."""
    source = st.radio("Texts", list(SOURCES), format_func=SOURCES.get, horizontal=True, key="corpus_source")
    if source == "demo":
        demo, how_many = demo_texts(settings)
        st.caption(f"Short texts the team wrote, {how_many}: ambiguous words (bank, flies, bat, bark, …) in several "
                   "senses, sentence pairs, and paragraphs of up to 211 tokens.")
        return demo, None
    if source == "upload":
        upload = st.file_uploader("A .txt (one text per line), .csv, .tsv or .jsonl file",
                                  type=[k.lstrip(".") for k in FILE_KINDS], key="corpus_upload")
        if upload is None:
            st.info(f"Upload a file; the page runs at most {cap:,} texts of it (the CLI has no cap).")
            return None, None
        data = upload.getvalue()
        columns = table_columns(data, upload.name)
        column = pair = None
        if columns:
            c1, c2 = st.columns(2)
            default = next((i for i, c in enumerate(columns) if c in ("text", "sentence", "sentence1")), 0)
            column = c1.selectbox("Text column", columns, index=default, key="corpus_column")
            pair = c2.selectbox("Sentence B column (optional)", ["(none)", *columns], key="corpus_pair")
            pair = None if pair == "(none)" else pair
        return read_upload(data, upload.name, column=column, pair_column=pair, limit=cap), None
    if source == "hub":
        with st.form("corpus_hub"):
            c1, c2 = st.columns([2, 1])
            dataset_id = c1.text_input("Dataset id (or a local dataset folder)", key="corpus_hub_id",
                                       placeholder="e.g. glue or a folder of .jsonl/.csv files")
            split = c2.text_input("Split", value="train", key="corpus_hub_split")
            c3, c4, c5 = st.columns(3)
            column = c3.text_input("Text column (empty: text, sentence, … or the first)", key="corpus_hub_column")
            pair = c4.text_input("Sentence B column (optional)", key="corpus_hub_pair")
            limit = c5.number_input("Rows", 1, cap, min(1000, cap), key="corpus_hub_limit")
            submitted = st.form_submit_button("Load the dataset")
        if not (submitted or st.session_state.get("_corpus_hub_loaded")) or not dataset_id.strip():
            st.info(f"Type a dataset id and press Load; at most {cap:,} rows (AE_CORPUS_MAX_TEXTS).")
            return None, None
        st.session_state["_corpus_hub_loaded"] = True
        return _hub_corpus(dataset_id.strip(), split.strip() or "train", column.strip() or None,
                           pair.strip() or None, int(limit)), None
    if not settings.allow_local_models:
        st.info("Opening folders on the server is switched off on this deployment (AE_ALLOW_LOCAL_MODELS=false).")
        return None, None
    path = st.text_input("Run folder (made by `python -m model_core corpus … --out FOLDER`)", key="corpus_folder")
    return (None, Path(path.strip()).expanduser()) if path.strip() else (None, None)


try:
    corpus, folder = _choose_texts()
except CorpusInputError as exc:
    st.error(str(exc))
    st.stop()
long = st.radio("Texts longer than the token limit", ["truncate", "skip"], horizontal=True, key="corpus_long",
                format_func={"truncate": "Truncate (counted)", "skip": "Skip (counted)"}.get)
if corpus is not None:
    for note in corpus.notes:
        st.caption(f"Note: {note}")


# -- the run -----------------------------------------------------------------------------------------
def _run(corpus, folder: Path, resume: bool) -> None:
    run_with_progress(corpus, model, folder, page_options(settings, long), resume)


cancelled = st.session_state.setdefault(CANCELLED, set())
if st.session_state.get("corpus_cancel") and st.session_state.get(RUNNING):
    cancelled.add(st.session_state.pop(RUNNING))
    st.warning("Cancelled. The texts already run are kept; press Resume to continue.")

if corpus is not None:
    folder = run_folder(settings, model, corpus.fingerprint, page_options(settings, long))
    manifest = folder / "manifest.json"
    partial = manifest.exists() and (folder / "head_stats.npz").exists()
    try:
        complete = partial and open_cached(folder).complete
    except CorpusRunError:  # a folder of an older version: run it again from scratch
        import shutil

        shutil.rmtree(folder, ignore_errors=True)
        partial = complete = False
    if not complete:
        auto = SOURCES[st.session_state["corpus_source"]] == SOURCES["demo"] and str(folder) not in cancelled
        label = "Resume the run" if manifest.exists() else f"Run {len(corpus):,} texts"
        if st.button(label, type="primary", key="corpus_run") or auto:
            cancelled.discard(str(folder))
            _run(corpus, folder, resume=manifest.exists())
        if not partial:
            st.stop()
    elif st.session_state.pop(JUST_RAN, None) != str(folder):
        st.caption("Opened from the page's run folder: the same texts and model were run before, nothing was recomputed.")

if folder is None:
    st.stop()
try:
    run = open_cached(folder)
except CorpusRunError as exc:
    st.error(str(exc))
    st.stop()


def _switch_model() -> None:
    for key, value in sidebar_state(run.manifest["model"]).items():
        st.session_state[key] = value


if run.manifest["model"] != model.key():
    theirs = CorpusModel.from_key(run.manifest["model"]).label()
    st.warning(f"This run was made with {theirs}; the sidebar has {model.label()}. Its heads and texts belong to its "
               "own model, so the page opens it only with that model in the sidebar.")
    st.button("Switch the sidebar to the run's model", on_click=_switch_model, key="corpus_switch")
    st.stop()


# -- the results -------------------------------------------------------------------------------------
st.session_state[OPEN_RUN] = str(run.path)  # the Query-key space page reads the same run
counts, timings = run.manifest["counts"], run.manifest["timings"]
c1, c2, c3, c4 = st.columns(4)
c1.metric("Texts", f"{run.n_texts:,}" + ("" if run.complete else f" of {counts['texts']:,}"))
c2.metric("Tokens", f"{counts['tokens']:,}")
c3.metric("Time", f"{timings['seconds']:.1f} s")
c4.metric("Texts / s", f"{timings['texts_per_s']:.0f}" if timings.get("texts_per_s") else "–")
if not run.complete:
    st.info("This run is partial (cancelled or interrupted): the statistics cover the texts run so far.")
if counts["truncated"] or counts["skipped"]:
    st.caption(f"{counts['truncated']} text(s) truncated and {counts['skipped']} skipped at the token limit.")

n_layers, n_heads = run.shape
names = [n for n in STAT_NAMES if np.isfinite(run.stat(n)[0]).any()]
s1, s2 = st.columns([2, 1])
stat = s1.selectbox("Statistic", names, format_func=STAT_TITLES.get, key="corpus_stat")
show = s2.radio("Show", ["mean", "std"], horizontal=True, key="corpus_show",
                format_func={"mean": "Mean over texts", "std": "Standard deviation"}.get)
mean, std = run.stat(stat)
count = run.count[STAT_NAMES.index(stat)]
kept = get_focus()  # the one focus, held to the run's shape (a run may be of another model than the sidebar's)
focus = (min(kept.layer, n_layers - 1), min(kept.head, n_heads - 1))


def _focus_from(chart_key: str) -> None:
    cell = clicked_cell(chart_key)
    if cell is not None:
        set_focus(*cell)


left, right = st.columns([3, 2])
with left:
    is_entropy = stat == "entropy"
    zmax = None if show == "std" else (float(np.nanmax(mean)) if is_entropy else 1.0)
    fig = corpus_stat_figure(mean, std, count, run.patterns, f"{STAT_TITLES[stat]}: corpus {show}",
                             show=show, zmax=zmax, colorbar="bits" if is_entropy else "share")
    show_figure(fig, f"corpus_{stat}_{show}", key="corpus_grid", on_select=lambda: _focus_from("corpus_grid"))
with right:
    colour = st.radio("Colour the heads by", ["pattern", *PROBE_ROLES], horizontal=True, key="corpus_colour",
                      format_func=lambda c: "Pattern type" if c == "pattern" else f"{ROLE_TITLES[c]} score")
    if colour == "pattern":
        show_figure(pattern_figure(run.patterns), "corpus_patterns", key="corpus_patterns",
                    on_select=lambda: _focus_from("corpus_patterns"))
    else:  # the Head roles page's probe scores of the same model, the pattern types beside them
        role_grid = probe_scores(roles_model_key(ctx.request), 0).scores[colour]
        show_figure(role_pattern_figure(role_grid, run.patterns, colour), f"corpus_{colour}_heads",
                    key="corpus_patterns", on_select=lambda: _focus_from("corpus_patterns"))
        st.caption("Scores from the Head roles page's probe (seed 0), not from the corpus; the hover names each "
                   "head's pattern type. Mean score per pattern type:")
        st.dataframe(mean_by_pattern(role_grid, run.patterns), hide_index=True)
    rules = PatternRules(**run.manifest.get("pattern_rules", {}))
    types, tallies = np.unique(run.patterns, return_counts=True)
    tally = dict(zip(types.tolist(), tallies.tolist()))
    st.table({"type": [t for t, _ in rules.describe()], "rule (corpus means)": [r for _, r in rules.describe()],
              "heads": [tally.get(t, 0) for t, _ in rules.describe()]})
    if not run.manifest["corpus"].get("has_pairs"):
        st.caption("No sentence pairs in this corpus, so no head can be called block.")

layer, head = focus
st.subheader(f"Layer {layer}, head {head}: {STAT_TITLES[stat].lower()}")
st.caption(f"Corpus mean {mean[layer, head]:.4f} ± {std[layer, head]:.4f} over {int(count[layer, head]):,} texts; "
           f"pattern: {run.patterns[layer, head]}. Pick a head by clicking either grid.")
top, bottom = run.extremes(stat, layer, head, k=5)
model_key = run.manifest["model"]


def _open_text(row: dict) -> None:
    """Load a text into the sidebar, with the run's model and this head in focus, and open the heatmaps."""
    load_text_and_head(model_key, row["text_a"], row["text_b"], layer, head, OPEN_FLAG)


for title, rows in (("Highest", top), ("Lowest", bottom)):
    st.markdown(f"**{title}**: *Open* loads the text into the sidebar with this head in focus; *link* is the same "
                "view as a URL to share.")
    for i, row in enumerate(rows):
        c1, c2, c3, c4 = st.columns([1, 9, 1, 1], vertical_alignment="center")
        c1.markdown(f"`{row['value']:.4f}`")
        text = row["text_a"] + (f"  ‖  {row['text_b']}" if row["text_b"] else "")
        c2.text(text if len(text) <= 300 else text[:300] + "…", help=f"text {row['text_id']}, {row['n_tokens']} tokens")
        c3.button("Open", key=f"corpus_open_{title}_{i}", on_click=_open_text, args=(row,))
        c4.markdown(f"[link]({text_link(model_key, row['text_a'], row['text_b'], layer, head)})")

st.subheader("Download")
d1, d2, d3 = st.columns(3)
with open(run.path / "head_stats.npz", "rb") as fh:
    d1.download_button("head_stats.npz", fh.read(), file_name="head_stats.npz", mime="application/octet-stream",
                       key="corpus_npz")
d2.download_button("manifest.json", json.dumps(run.manifest, indent=2, ensure_ascii=False),
                   file_name="manifest.json", mime="application/json", key="corpus_manifest")
per_head = [{"layer": la, "head": h, "pattern": str(run.patterns[la, h]),
             **{f"{n}_{k}": float(arr[la, h]) for n in STAT_NAMES for k, arr in zip(("mean", "std"), run.stat(n))}}
            for la in range(n_layers) for h in range(n_heads)]
with d3:
    csv_button("Per-head corpus statistics (CSV)", rows_to_csv(per_head), "corpus_head_stats.csv", "corpus_csv")
ids, values = run.per_text(stat, layer, head)
csv_button(f"This head's {stat} for every text (CSV)",
           lambda: rows_to_csv([{"text_id": i, "value": v} for i, v in zip(ids, values)]), f"corpus_{stat}_L{layer}H{head}.csv",
           "corpus_text_csv")
st.caption(f"The whole run (every text, every head, every statistic) is the folder {run.path}: texts.parquet/ "
           "holds one row per text.")
