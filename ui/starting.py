"""The server's first run: a note saying what is loading while app.py imports PyTorch and Transformers, before it can
draw anything else. app.py imports this module before those imports and calls ``done`` once its trace is there.

Light on purpose: it imports only streamlit and ``model_core.settings`` (neither loads torch)."""

from __future__ import annotations

import sys
from typing import Any

import streamlit as st

from model_core.settings import load_settings

FIRST_LOAD_S = 15
"""About how long the server's first run takes before its first figure: importing PyTorch and Transformers (8-12 s),
loading MiniLM (1 s) and its first trace, measured on a 2-core machine beside other jobs (12-15 s)."""


def _model_name() -> str:
    """The model the first run loads, from the link (``model``, ``model_id``) or the deployment's default."""
    params = st.query_params
    if params.get("model") == "custom":
        return "the chapter-3 encoder"
    model_id = params.get("model_id") or load_settings().default_model
    return str(model_id).removeprefix("bundled:")


def first_run_note() -> Any:
    """On the process's first run (PyTorch not imported yet), a note in the page saying what loads and about how
    long; None on any later run."""
    if "torch" in sys.modules:
        return None
    slot = st.empty()
    slot.info(f"Loading PyTorch, Transformers and {_model_name()} (first visit to this server only, about "
              f"{FIRST_LOAD_S} s)…", icon=":material/hourglass_top:")
    return slot


_NOTE = first_run_note()


def done() -> None:
    """Clear the first run's note (a no-op on later runs)."""
    global _NOTE
    if _NOTE is not None:
        _NOTE.empty()
        _NOTE = None
