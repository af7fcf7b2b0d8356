"""Composition scores in the app: the scores of a model, computed once per model for every session
(``cached_composition``), and ``render_composition``, which draws the Q/K/V grids in tabs, each with its CSV, and the
table of the strongest pairs (each head a link where the page gives one). A page ("Why this key") calls both."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import pandas as pd
import streamlit as st

from attention_explorer.composition import NOTE, composition_figure, top_pair_rows
from model_core import TraceRequest
from model_core.io.tables import matrix_to_csv
from model_core.qk.composition import (
    KIND_TITLES,
    KINDS,
    CompositionScores,
    composition_for_request,
)
from ui.downloads import figure_config
from ui.guard import view_guard

COMPOSITION_TTL_S = 6 * 3600
CSV_CORNER = "earlier head \\ later head"


def model_key(request: TraceRequest) -> TraceRequest:
    """The request with its text and head mask dropped: the scores read the model's weights alone."""
    return dataclasses.replace(request, text_a="", text_b="", truncate=False, head_mask=None, token_ids=None,
                               reply_start=None)


@st.cache_resource(max_entries=8, ttl=COMPOSITION_TTL_S, show_spinner=False)
def cached_composition(model: TraceRequest, seed: int = 0) -> CompositionScores:
    """``model_core.qk.composition_for_request`` of a model (pass ``model_key(request)``), once per (model, seed) for
    every session; the model comes from the app's model cache. The result's arrays are read-only."""
    from ui.loaders import CACHED_MODELS, device

    with st.spinner("Composing every pair of heads from the weights…"):
        return composition_for_request(model, device=device(), seed=seed, models=CACHED_MODELS)


def grid_csv(scores: CompositionScores, kind: str) -> str:
    """One kind's grid as CSV: rows the earlier head, columns the later head ("L0H0", ...); empty where a pair cannot
    compose."""
    labels = scores.labels()
    return matrix_to_csv(scores.scores(kind), labels, labels, corner=CSV_CORNER)


def pairs_frame(scores: CompositionScores, top: int,
                open_url: Callable[[int, int], str] | None = None) -> pd.DataFrame:
    """The ``top`` strongest pairs of each kind, with a link to open each head where ``open_url(layer, head)`` is
    given."""
    rows = top_pair_rows(scores, top)
    frame = pd.DataFrame(rows, columns=["kind", "earlier head", "later head", "score", "x baseline",
                                        "source_layer", "source_head", "target_layer", "target_head"])
    if open_url is not None:
        frame["open earlier"] = [open_url(r["source_layer"], r["source_head"]) for r in rows]
        frame["open later"] = [open_url(r["target_layer"], r["target_head"]) for r in rows]
    return frame.drop(columns=["source_layer", "source_head", "target_layer", "target_head"])


def render_composition(scores: CompositionScores, *, key: str = "composition", top: int = 10,
                       open_url: Callable[[int, int], str] | None = None, stem: str = "composition") -> None:
    """Draw composition scores: a tab a kind (Q, K, V) with its grid and a CSV download of it, then the strongest
    pairs of each kind beside the random baseline.

    Args:
        key: the widgets' key prefix (two renders on one page need two keys).
        top: pairs of each kind in the table.
        open_url: (layer, head) -> a link (relative to the app) that opens that head, e.g. the heatmaps page with
            it in focus; None: the table has no links.
        stem: the downloads' file names start with it.
    """
    st.caption(NOTE)
    tabs = st.tabs([f"{KIND_TITLES[kind]}" for kind in KINDS])
    for tab, kind in zip(tabs, KINDS):
        with tab, view_guard(f"{KIND_TITLES[kind]} grid"):
            st.plotly_chart(composition_figure(scores, kind), config=figure_config(f"{stem}_{kind}"),
                            key=f"{key}_{kind}_grid")
            st.download_button(f"{KIND_TITLES[kind]} grid (CSV)", lambda kind=kind: grid_csv(scores, kind),
                               file_name=f"{stem}_{kind}.csv", mime="text/csv", key=f"{key}_{kind}_csv",
                               on_click="ignore")
    with view_guard("composition pairs"):
        base = scores.baseline
        st.markdown(f"**Strongest pairs** (random baseline: Q {base['q']:.3f}, K {base['k']:.3f}, "
                    f"V {base['v']:.3f})")
        columns = {"score": st.column_config.NumberColumn(format="%.4f"),
                   "x baseline": st.column_config.NumberColumn("× baseline", format="%.1f")}
        if open_url is not None:
            columns["open earlier"] = st.column_config.LinkColumn("earlier head", display_text="open ↗")
            columns["open later"] = st.column_config.LinkColumn("later head", display_text="open ↗")
        st.dataframe(pairs_frame(scores, top, open_url), hide_index=True, width="stretch", column_config=columns,
                     key=f"{key}_pairs")
