"""Corpus page plumbing: the sidebar's model as a corpus model, cached runs, and the link that opens a text."""

from __future__ import annotations

import hashlib
from dataclasses import fields
import html
import json
import urllib.parse
from pathlib import Path
from typing import Any

import streamlit as st

from model_core import TraceRequest
from model_core.chapter3.spec import CustomOptions
from model_core.trace.request import MODEL_FIELDS
from model_core.corpus import (
    Corpus,
    CorpusModel,
    CorpusRun,
    CorpusRunError,
    LoadedCorpusModel,
    RunOptions,
    demo_corpus,
    open_run,
    run_corpus,
)
from model_core.corpus.run import CORPUS_MAX_TOKENS
from model_core.corpus.sample import DEFAULT_CAP
from model_core.settings import Settings, corpus_runs_dir
from model_core.gate import waiting_with
from ui.loaders import CACHED_MODELS, device
from ui.fields import control_key, request_params, request_state
from ui.focus import set_focus
from ui.waiting import queue_text


RUNNING = "_corpus_running"  # the folder of a run this session started and has not seen finish
JUST_RAN = "_corpus_just_ran"
CANCELLED = "_corpus_cancelled"  # folders whose run the user cancelled (no automatic restart)
OPEN_RUN = "_corpus_open_run"  # the run the Corpus page shows; the Query-key space page reads it
PAGE_SHARD = 128  # texts per shard on the page: a cancel keeps all but the shard in progress


def demo_texts(settings: Settings) -> tuple[Corpus, str]:
    """The demo corpus as this deployment runs it, and how to say so: all of it, or its first
    ``AE_CORPUS_MAX_TEXTS`` texts where that setting is lower (a small server's cap on every corpus run)."""
    demo = demo_corpus(limit=settings.corpus_max_texts)  # one read: total_seen counts the texts past the cap
    if demo.total_seen <= len(demo):
        return demo, f"{len(demo)} texts"
    return demo, f"the first {len(demo)} of its {demo.total_seen} texts (AE_CORPUS_MAX_TEXTS on this server)"


def page_options(settings: Settings, long: str) -> RunOptions:
    """How the pages run a corpus: small shards, the token sample with queries/keys, and the index."""
    return RunOptions(chunk_size=PAGE_SHARD, long=long, max_tokens=min(settings.max_tokens, CORPUS_MAX_TOKENS),  # type: ignore[arg-type]
                      sample_cap=DEFAULT_CAP, keep_qk=True, index=True)


def run_with_progress(corpus, model: CorpusModel, folder: Path, options: RunOptions, resume: bool) -> None:
    """Run (or resume) with a progress bar (count, rate, time left) and a Cancel button, then rerun.

    A click on Cancel (or any widget) stops the script mid-run; the finished shards stay in ``folder``.
    """
    st.session_state[RUNNING] = str(folder)
    bar_col, cancel_col = st.columns([5, 1])
    bar = bar_col.progress(0.0, text=f"Running {len(corpus):,} texts through {model.label()}…")
    cancel_col.button("Cancel", key="corpus_cancel", help="Stops the run; the finished part is kept and can resume.")

    done = [0.0]  # the bar's fraction, kept while a batch waits for its turn

    def progress(p) -> None:
        eta = f" · about {p.eta_s:.0f} s left" if p.eta_s is not None else ""
        done[0] = min(p.done / p.total, 1.0)
        bar.progress(done[0], text=f"{p.done:,} / {p.total:,} texts · {p.rate:.0f} texts/s{eta}")

    try:
        with st.spinner("Loading the model…"):
            loaded = loaded_model(model)
        # Each batch takes its turn at the gate; while it waits, the bar says its place (Cancel leaves the queue).
        with waiting_with(lambda place, running: bar.progress(done[0], text=queue_text(place, running))):
            run_corpus(corpus, model, folder, options=options, loaded=loaded, resume=resume, progress=progress)
    except (CorpusRunError, ValueError) as exc:
        st.session_state.pop(RUNNING, None)
        st.error(str(exc))
        st.stop()
    st.session_state.pop(RUNNING, None)
    st.session_state[JUST_RAN] = str(folder)
    st.rerun()  # draw the finished run from its folder


def sidebar_model_or_stop(request: TraceRequest | None) -> CorpusModel:
    """The sidebar's model for a corpus page, as a corpus run records it, or stop the page saying why it
    cannot be used (``request`` is None when the sidebar's options do not fit together)."""
    if request is None:
        st.info("The sidebar's model cannot be used: its settings do not fit together (the sidebar says why).")
        st.stop()
    try:
        return CorpusModel.from_request(request)
    except ValueError as exc:
        st.info(f"The sidebar's model cannot be used: {exc}")
        st.stop()
        raise AssertionError("st.stop() returned")  # it raises; this keeps the return type honest


def load_text_and_head(model_key: dict[str, Any], text_a: str, text_b: str | None, layer: int, head: int,
                       flag: str) -> None:
    """From a widget callback: put the run's model and a text in the sidebar, focus the head, and set ``flag``
    (the page then switches to the heatmaps at the start of its next run)."""
    for key, value in sidebar_state(model_key).items():
        st.session_state[key] = value
    st.session_state[control_key("text_a")], st.session_state[control_key("text_b")] = text_a, text_b or ""
    set_focus(layer, head)
    st.session_state[flag] = True


def loaded_model(model: CorpusModel) -> LoadedCorpusModel:
    """The app's cached copy of ``model`` (the same one the traces use), ready for batches."""
    return model.load(device(), models=CACHED_MODELS)


def run_folder(settings: Settings, model: CorpusModel, fingerprint: str, options: RunOptions) -> Path:
    """The page's folder for (model, texts, options): the same inputs reopen the same run."""
    from dataclasses import asdict

    key = json.dumps({"model": model.key(), "options": asdict(options)}, sort_keys=True)
    tag = hashlib.sha256(key.encode()).hexdigest()[:12]
    return corpus_runs_dir(settings) / f"{model.kind}-{tag}-{fingerprint[:16]}"


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_run(path: str, stamp: float) -> CorpusRun:
    """A run folder opened once per version of its manifest (``stamp``: the manifest's mtime)."""
    return open_run(path)


def open_cached(path: str | Path) -> CorpusRun:
    manifest = Path(path) / "manifest.json"
    return cached_run(str(path), manifest.stat().st_mtime if manifest.exists() else 0.0)


def _model_request(model_key: dict[str, Any]) -> tuple[TraceRequest, tuple[str, ...]]:
    """A run's model as a sidebar request, and the fields that name it (a pretrained model: its id alone)."""
    model = CorpusModel.from_key(model_key)
    if model.kind == "pretrained":
        return TraceRequest("pretrained", model_id=model.model_id), ("model", "model_id")
    options = {f.name: getattr(model.custom, f.name) for f in fields(CustomOptions)}
    return TraceRequest("custom", model_id=model.model_id, **options), MODEL_FIELDS


def link_params(model_key: dict[str, Any]) -> dict[str, str]:
    """The query parameters that open a run's model in the sidebar."""
    return request_params(*_model_request(model_key))


def text_link(model_key: dict[str, Any], text_a: str, text_b: str | None, layer: int, head: int) -> str:
    """A relative link that opens the heatmaps page on this text with this head in focus (shareable)."""
    params = {**link_params(model_key), "text_a": text_a, "text_b": text_b or "", "layer": str(layer), "head": str(head)}
    return "heatmaps?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


def sidebar_state(model_key: dict[str, Any]) -> dict[str, Any]:
    """Session-state values that put ``model_key``'s model into the sidebar."""
    return {key: value for key, value in request_state(*_model_request(model_key)).items() if value is not None}


@st.cache_resource(max_entries=4, show_spinner="Reading the sample's contexts…")
def sample_contexts(path: str, stamp: float, model_key_json: str) -> dict[str, Any]:
    """Per sample row: the token in its text (a few tokens either side), its token type and text id."""
    import numpy as np

    from model_core.corpus.batches import encode_texts
    from model_core.corpus.neighbours import sample_tokens

    run = cached_run(path, stamp)
    table = sample_tokens(run)
    text_ids = table["text_id"].to_numpy()
    positions = table["position"].to_numpy()
    texts = run.texts()
    where = {int(t): i for i, t in enumerate(texts["text_id"].to_numpy())}
    wanted = sorted(set(int(t) for t in text_ids))
    pairs = [(texts["text_a"][where[t]].as_py(), texts["text_b"][where[t]].as_py()) for t in wanted]
    # From the app's model cache (no model copy outside it): the run's model id, None for the bundled vocabulary.
    tokenizer = CACHED_MODELS.tokenizer(CorpusModel.from_key(json.loads(model_key_json)).model_id, device())
    options = run.manifest["options"]
    encoded = {}
    for start in range(0, len(pairs), 512):
        chunk = pairs[start:start + 512]
        rows, _ = encode_texts(tokenizer, chunk, 0, options["max_tokens"], options["long"])
        for r in rows:
            encoded[wanted[start + r.text_id]] = r
    hover, types = [], np.zeros(len(text_ids), dtype=np.int8)
    # One hover string per row, the token's neighbours escaped so that a "<b>" in a text stays text.
    for i, (t, p) in enumerate(zip(text_ids, positions)):
        e = encoded.get(int(t))
        if e is None or p >= len(e.ids):
            hover.append(f"text {t}, position {p}")
            continue
        toks = tokenizer.convert_ids_to_tokens(e.ids[max(0, p - 3): p + 4])
        mid = min(p, 3)
        toks[mid] = f"⟦{toks[mid]}⟧"
        hover.append(f"{html.escape(' '.join(toks), quote=False)}<br>text {t}, position {p}")
        types[i] = e.types[p]
    return {"hover": hover, "types": types, "text_ids": text_ids, "positions": positions,
            "tokens": table["token"].to_pylist()}


@st.cache_resource(max_entries=16, show_spinner="Projecting queries and keys…")
def cached_projection(path: str, stamp: float, layer: int, head: int, n_heads: int, method: str, seed: int = 0):
    from model_core.corpus.qk_space import head_vectors, joint_projection

    q, k = head_vectors(Path(path), layer, head, n_heads)
    return joint_projection(q, k, method=method, seed=seed)


@st.cache_resource(max_entries=8, show_spinner="Projecting every head of the layer…")
def cached_layer_grid(path: str, stamp: float, layer: int, n_heads: int, per_head: int = 800):
    from model_core.corpus.qk_space import head_vectors, joint_projection

    return [joint_projection(*head_vectors(Path(path), layer, h, n_heads), limit=per_head, seed=h)
            for h in range(n_heads)]
