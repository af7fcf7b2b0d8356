"""The Home page's links: every page of app.py's ``PAGES`` as a link with one line on what it shows, and two short
"start here" paths (reading chapter 3's encoder; studying a decoder). The titles and icons are app.py's: it hands
its ``PAGES`` over with ``register_pages``, so there is one list of pages."""

from __future__ import annotations

from dataclasses import dataclass

import streamlit as st

from ui.state import use_bundled_decoder


@dataclass(frozen=True)
class PageEntry:
    """One page of the navigation: its file, title, icon and section (app.py's ``PAGES`` row)."""

    path: str
    title: str
    icon: str
    section: str


_PAGES: list[PageEntry] = []


def register_pages(pages: list[tuple]) -> None:
    """app.py's ``PAGES`` rows (file, title, icon, section, ...), for the Home page's links."""
    _PAGES[:] = [PageEntry(path, title, icon, section) for path, title, icon, section, *_ in pages]


def app_pages() -> list[PageEntry]:
    """The navigation's pages, in app.py's order.

    Raises:
        RuntimeError: app.py has not registered them (a page run outside app.py).
    """
    if not _PAGES:
        raise RuntimeError("app.py registers its pages (ui.home.register_pages) before a page runs; run app.py.")
    return list(_PAGES)


NOTES = {
    "pages/home.py": "a first heatmap, where to start, and this list.",
    "pages/heatmaps.py": "every layer × head at a glance, then one head in detail; each row is a query's attention, "
                         "summing to 1.",
    "pages/why_this_key.py": "a head's score at a (query, key) split into the components that wrote the query and "
                             "the key: embeddings, earlier heads, MLPs.",
    "pages/predictions.py": "a decoder's likely next tokens at every position, and the logit lens layer by layer.",
    "pages/causal.py": "from scores QKᵀ/√d to the mask (−∞), the masked scores and the softmax, bidirectional "
                       "beside causal.",
    "pages/inside.py": "chapter 3's walk from tokens to logits with every tensor's shape; for a decoder, one block "
                       "step by step.",
    "pages/bertviz.py": "bertviz's head, model and neuron views, served offline.",
    "pages/analysis_contexts.py": "the same word's attention and representation in two sentences.",
    "pages/analysis_rollout.py": "attention rolled out through the layers, the residual stream counted.",
    "pages/analysis_norms.py": "attention weighted by the size of what each key's value writes.",
    "pages/analysis_head_stats.py": "each head's entropy, distance and favourite tokens.",
    "pages/analysis_masking.py": "switch heads off and see what changes.",
    "pages/head_roles.py": "which heads look at the previous token, repeat an earlier one or copy (induction).",
    "pages/contributions.py": "how much each token and head contributes to every representation, as a graph.",
    "pages/attribution.py": "each head's, MLP's and the embedding's direct effect on the next-token logit.",
    "pages/patching.py": "each head's effect when its output is taken from a clean prompt into a corrupted one.",
    "pages/circuits.py": "the edges that carry a task over a dataset (EAP, EAP-IG), drawn, with their faithfulness.",
    "pages/generate.py": "a decoder's reply token by token, with each new token's attention.",
    "pages/kv_cache.py": "what a compressed key/value cache keeps (StreamingLLM, SnapKV, TOVA…) and what it costs.",
    "pages/corpus.py": "head statistics over many texts, in a streamed run that can resume.",
    "pages/corpus_space.py": "every token's query and key in one space, and its nearest contexts.",
    "pages/head_atlas.py": "what every head does across a corpus, each head on one card.",
}
"""One line per page file: what it shows (the title is app.py's)."""

CHAPTER_3 = ("pages/inside.py", "pages/causal.py", "pages/heatmaps.py", "pages/bertviz.py",
             "pages/analysis_rollout.py")
"""Reading chapter 3 of *Natural Language Processing with Transformers*: its encoder from the inside out."""
DECODER = ("pages/heatmaps.py", "pages/why_this_key.py", "pages/head_roles.py", "pages/patching.py",
           "pages/generate.py")
"""Studying a decoder: where it looks, why, which heads do what, which matter, and its reply."""


def _use_chapter3_encoder() -> None:
    st.session_state["ctl_model"] = "custom"


def start_here(using_custom: bool, using_decoder: bool) -> None:
    """The two "start here" paths: their pages as numbered links, and a button that puts the path's model in the
    sidebar (left out when the sidebar has it: ``using_custom``, ``using_decoder``)."""
    by_path = {p.path: p for p in app_pages()}
    st.subheader("Start here")
    for title, pages, label, use, key, using in (
            ("Reading chapter 3: the encoder built from scratch", CHAPTER_3, "the chapter-3 encoder",
             _use_chapter3_encoder, "home_use_custom", using_custom),
            ("Studying a decoder language model", DECODER, "SmolLM2, the bundled decoder", use_bundled_decoder,
             "home_use_decoder", using_decoder)):
        st.markdown(f"**{title}**")
        for n, page in enumerate((by_path[path] for path in pages if path in by_path), 1):
            st.page_link(page.path, label=f"{n}. {page.title}", icon=page.icon)
        if not using:
            st.button(f"Use {label} in the sidebar", key=key, on_click=use, type="tertiary",
                      icon=":material/swap_horiz:")


def every_page() -> None:
    """Every page, by the navigation's sections: its link and one line on what it shows."""
    section = None
    for page in app_pages():
        if page.section != section:
            section = page.section
            st.markdown(f"**{section}**")
        link, note = st.columns([2, 5], vertical_alignment="center")
        with link:
            st.page_link(page.path, label=page.title, icon=page.icon)
        note.caption(NOTES.get(page.path, ""))
