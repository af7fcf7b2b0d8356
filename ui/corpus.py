"""Corpus page plumbing: the sidebar's model as a corpus model, cached runs, and the link that opens a text."""

from __future__ import annotations

import hashlib
import json
import urllib.parse
from pathlib import Path
from typing import Any

import streamlit as st

from model_core.corpus import CorpusModel, CorpusRun, LoadedCorpusModel, open_run
from model_core.settings import Settings, corpus_runs_dir
from ui.loaders import get_bert, get_custom_model
from ui.state import Controls


def corpus_model(controls: Controls) -> CorpusModel:
    """The sidebar's model, as a corpus run records it."""
    return CorpusModel.from_options(**controls.trace_key())


def loaded_model(model: CorpusModel) -> LoadedCorpusModel:
    """The app's cached copy of ``model`` (the same one the traces use), ready for batches."""
    if model.kind == "bert":
        return LoadedCorpusModel.from_bert(model, get_bert(model.model_id))
    assert model.custom is not None
    from model_core.loading import load_tokenizer

    tokenizer = get_bert(model.custom.model_id).tokenizer if model.custom.model_id else load_tokenizer()
    return LoadedCorpusModel.from_custom(model, get_custom_model(model.custom), tokenizer)


def run_folder(settings: Settings, model: CorpusModel, fingerprint: str, options: dict[str, Any]) -> Path:
    """The page's folder for (model, texts, options): the same inputs reopen the same run."""
    key = json.dumps({"model": model.key(), "options": options}, sort_keys=True)
    tag = hashlib.sha256(key.encode()).hexdigest()[:12]
    return corpus_runs_dir(settings) / f"{model.kind}-{tag}-{fingerprint[:16]}"


@st.cache_resource(max_entries=8, show_spinner=False)
def cached_run(path: str, stamp: float) -> CorpusRun:
    """A run folder opened once per version of its manifest (``stamp``: the manifest's mtime)."""
    return open_run(path)


def open_cached(path: str | Path) -> CorpusRun:
    manifest = Path(path) / "manifest.json"
    return cached_run(str(path), manifest.stat().st_mtime if manifest.exists() else 0.0)


# The sidebar's query parameters for a model key (ui.state.QUERY_PARAMS names).
def link_params(model_key: dict[str, Any]) -> dict[str, str]:
    if model_key["kind"] == "bert":
        return {"model": "bert", "model_id": model_key["model_id"]}
    params = {"model": "custom", "weights": model_key["weights"], "seed": str(model_key["seed"]),
              "causal": str(model_key["causal"]).lower(), "norm": model_key["norm_placement"],
              "layers": str(model_key["num_layers"]), "heads": str(model_key["num_heads"]),
              "hidden": str(model_key["hidden_size"])}
    if model_key["weights"] == "pretrained":
        params["model_id"] = model_key["model_id"]
    return params


def text_link(model_key: dict[str, Any], text_a: str, text_b: str | None, layer: int, head: int) -> str:
    """A relative link that opens the heatmaps page on this text with this head in focus (shareable)."""
    params = {**link_params(model_key), "a": text_a, "b": text_b or "", "layer": str(layer), "head": str(head)}
    return "heatmaps?" + urllib.parse.urlencode(params, quote_via=urllib.parse.quote)


def sidebar_state(model_key: dict[str, Any]) -> dict[str, Any]:
    """Session-state values that put ``model_key``'s model into the sidebar."""
    if model_key["kind"] == "bert":
        return {"ctl_model": "bert", "ctl_model_id": model_key["model_id"]}
    state = {"ctl_model": "custom", "ctl_weights": model_key["weights"], "ctl_seed": model_key["seed"],
             "ctl_causal": model_key["causal"], "ctl_norm": model_key["norm_placement"],
             "ctl_layers": model_key["num_layers"], "ctl_heads": model_key["num_heads"],
             "ctl_hidden": model_key["hidden_size"]}
    if model_key["weights"] == "pretrained":
        state["ctl_model_id"] = model_key["model_id"]
    return state
