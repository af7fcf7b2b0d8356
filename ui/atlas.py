"""The Head atlas page's loaders and widgets: where the page keeps its atlases, a cached open of a folder, a run with
progress and Stop, and the head card's sections (the figures and HTML are ``attention_explorer.atlas``'s)."""

from __future__ import annotations

import hashlib
import json
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import streamlit as st

from attention_explorer.atlas import contexts_html, profile_figure
from model_core.atlas import AtlasOptions, AtlasRun, AtlasRunError, open_atlas, run_atlas
from model_core.atlas.shard import LONG_FROM
from model_core.corpus import CorpusModel
from model_core.settings import Settings, corpus_runs_dir
from ui.analysis_widgets import show_figure
from ui.corpus import loaded_model
from ui.waiting import queue_text, waiting_with

RUNNING = "_atlas_running"  # the folder of a run this session started and has not seen finish
PAGE_SHARD = 64  # texts per shard on the page: a Stop keeps all but the shard in progress
PAGE_OPTIONS = AtlasOptions(chunk_size=PAGE_SHARD, max_tokens=128, qk_contexts=3)
"""How the page runs an atlas: texts cut at 128 tokens, the QK split at 3 contexts a head."""


def atlas_folder(settings: Settings, model: CorpusModel, fingerprint: str,
                 options: AtlasOptions = PAGE_OPTIONS) -> Path:
    """The page's folder for (model, texts, options): the same inputs reopen (or continue) the same atlas."""
    key = json.dumps({"model": model.key(), "options": asdict(options)}, sort_keys=True)
    tag = hashlib.sha256(key.encode()).hexdigest()[:12]
    return corpus_runs_dir(settings) / "atlas" / f"{model.kind}-{tag}-{fingerprint[:16]}"


@st.cache_resource(max_entries=8, show_spinner="Opening the atlas…")
def _cached(path: str, stamp: float) -> AtlasRun:
    run = open_atlas(path)
    if run.complete:
        run.heads  # noqa: B018 - read the cards once, here, not on every rerun
    return run


def open_cached(path: str | Path) -> AtlasRun:
    """An atlas folder opened once per version of its manifest (never mutate what it returns)."""
    manifest = Path(path) / "manifest.json"
    return _cached(str(path), manifest.stat().st_mtime if manifest.exists() else 0.0)


def run_with_progress(corpus: Any, model: CorpusModel, folder: Path, options: AtlasOptions = PAGE_OPTIONS) -> None:
    """Run (or continue) an atlas with a progress bar and a Stop button, then rerun.

    A click on Stop (or any widget) ends the script mid-run; the finished shards stay in ``folder`` and the next run
    continues from them."""
    st.session_state[RUNNING] = str(folder)
    bar_col, stop_col = st.columns([5, 1])
    bar = bar_col.progress(0.0, text=f"Scanning {len(corpus):,} texts through {model.label()}…")
    stop_col.button("Stop", key="atlas_stop", help="Stops the run; the finished part is kept and the next run "
                                                   "continues it.")
    done = [0.0]
    drawn = {"at": 0.0, "done": -1}

    def progress(p) -> None:
        # called after each head's split too: drawn (and a Stop seen) at most every quarter second within a text
        now = time.monotonic()
        if p.done == drawn["done"] and now - drawn["at"] < 0.25:
            return
        drawn.update(at=now, done=p.done)
        done[0] = min(p.done / max(p.total, 1), 1.0)
        what = "texts scanned" if p.stage == "scan" else "texts traced for the QK split and the logit effects"
        bar.progress(done[0], text=f"{p.done:,} / {p.total:,} {what} · {p.elapsed_s:.0f} s")

    try:
        with st.spinner("Loading the model…"):
            loaded = loaded_model(model)
        with waiting_with(lambda place, running: bar.progress(done[0], text=queue_text(place, running))):
            run_atlas(corpus, model, folder, options=options, loaded=loaded, progress=progress)
    except (AtlasRunError, ValueError) as exc:
        st.session_state.pop(RUNNING, None)
        st.error(str(exc))
        st.stop()
    st.session_state.pop(RUNNING, None)
    st.rerun()


def contexts_section(card: dict[str, Any]) -> None:
    """The top contexts as highlighted text (every token escaped): without the sink, every key, the deciles."""
    no_sink, every, deciles = st.tabs(["Top contexts (keys after the first token)", "Top contexts (every key)",
                                       "Typical: samples from each decile"])
    with no_sink:
        st.html(contexts_html(card["top_contexts_no_sink"]))
    with every:
        st.html(contexts_html(card["top_contexts"]))
    with deciles:
        for i, group in reversed(list(enumerate(card["deciles"]))):
            if group:
                st.caption(f"Decile {i + 1} of the texts' best weights (keys after the first token)")
                st.html(contexts_html(group))


def profile_section(card: dict[str, Any], layer: int, head: int) -> None:
    show_figure(profile_figure(card), f"atlas_profile_L{layer}H{head}", key="atlas_profile")
    entropy = card["profile"].get("entropy_bits")
    st.caption("Shares are means over every query row of the corpus; the same-token and induction shares are means "
               "over the rows where the query's token occurs elsewhere (before it, for induction)."
               + (f" Mean entropy {entropy:.2f} bits." if entropy is not None else ""))


def components_section(card: dict[str, Any], asked: int) -> None:
    """The QK split's top components; ``asked``: the atlas's contexts a head (its ``qk_contexts`` option)."""
    qk = card["qk"]
    if not qk:
        if asked == 0:
            why = "the atlas ran with 0 contexts a head"
        elif not card["top_contexts_no_sink"]:
            why = "it has no top context with a key after the first token"
        else:
            why = (f"its top contexts are in texts of {LONG_FROM:,} tokens or more, and this model's split of them "
                   "would pass the server's memory limit (AE_RUN_MEMORY_MB)")
        st.info(f"No QK split for this head: {why}.")
        return
    left, right = st.columns(2)
    for col, side, title in ((left, "query_side", "Query side"), (right, "key_side", "Key side")):
        col.markdown(f"**{title}**")
        col.dataframe([{"component": name, "share of the score above the row mean": share}
                       for name, share in qk[side]], hide_index=True, use_container_width=True)
    ranks = card.get("qk_context_ranks")
    which = (f"its top contexts {', '.join(f'#{r + 1}' for r in ranks)} (keys after the first token; the ranks "
             "of the list without the sink)" if ranks else
             f"the head's first {card.get('qk_contexts', 0)} top contexts (keys after the first token)")
    st.caption(f"Averaged over {which}: each component's part of the score above the mean score of the keys the "
               "query sees.")


def writes_section(card: dict[str, Any]) -> None:
    if card["copying_score"] is None:
        st.info("This model has no unembedding (an encoder): a head's write reaches no logits, so there is no "
                "copying score and no promoted tokens.")
        return
    st.metric("OV copying score", f"{card['copying_score']:.3f}",
              help="Elhage et al.'s Σλ / Σ|λ| of W_E W_V W_O W_U over the vocabulary's first 4,096 tokens (norm "
                   "gains folded in, biases and the per-position scales left out): 1 means it copies what it reads.")
    tokens = card["promoted_tokens"] or []
    if tokens:
        st.dataframe([{"token": repr(t), "direct logit effect": e} for t, e in tokens], hide_index=True,
                     use_container_width=True)
        st.caption("Mean direct effect of the head's output on each next-token logit at its top contexts (the "
                   "final norm frozen at each context, as the Direct logit attribution page reads it).")


def place_section(card: dict[str, Any]) -> None:
    roles = card["roles"]
    left, right = st.columns(2)
    left.markdown("**Head roles** (the probe's scores)")
    left.dataframe([{"role": r, "score": v} for r, v in roles.items() if r != "circuit_node_score"], hide_index=True,
                   use_container_width=True)
    node = roles.get("circuit_node_score")
    left.caption("Circuit node score: " + ("no circuit run given (the CLI's --circuit FILE)" if node is None
                                            else f"{node:.4g} (sum of |edge score| touching it)"))
    comp = card["composition"]
    right.markdown("**Top composition partners**")
    if comp is None:
        right.caption("A model of one layer: no head composes with another.")
        return
    rows = [{"kind": kind.upper(), "direction": side, "head": name, "score": score}
            for kind, sides in comp.items() for side, partners in sides.items() for name, score in partners]
    right.dataframe(rows, hide_index=True, use_container_width=True)
