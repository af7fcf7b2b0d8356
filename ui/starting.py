"""The server's first run: a note saying what is loading while app.py imports PyTorch and Transformers, before it can
draw anything else, and one lock so that the sessions of a fresh server import them in turn.

Streamlit runs app.py in one thread per session. Ten first visitors at once ran its imports in ten threads; Python
then hands a thread that meets another's import cycle the *partially initialised* module (a deadlock it breaks
that way), and a session failed with "AttributeError: module 'transformers' has no attribute ..." that stayed on the
page (tests/test_reliability_browser.py, ten concurrent sessions: 1 run in 8 failed so). ``heavy_imports`` makes
them take turns at app.py's imports, and ``first_run`` at the process's first whole run (the model's load and its
page's own imports, which pull in more of transformers' lazy modules): the first goes, the others wait for it, then
find everything in ``sys.modules`` and run side by side.

Light on purpose: it imports only streamlit and ``model_core.settings`` (neither loads torch)."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import streamlit as st

from model_core.settings import load_settings

FIRST_LOAD_S = 15
"""About how long the server's first run takes before its first figure: importing PyTorch and Transformers (8-12 s),
loading MiniLM (1 s) and its first trace, measured on a 2-core machine beside other jobs (12-15 s)."""

_IMPORTING = threading.Lock()
_imported = False
_first_run_done = False


def _model_name() -> str:
    """The model the first run loads, from the link (``model``, ``model_id``) or the deployment's default."""
    params = st.query_params
    if params.get("model") == "custom":
        return "the chapter-3 encoder"
    model_id = params.get("model_id") or load_settings().default_model
    return str(model_id).removeprefix("bundled:")


def first_run_note() -> Any:
    """While the server's first imports are not done, a note in this session's page saying what loads and about how
    long; None once they are."""
    if _imported:
        return None
    slot = st.empty()
    slot.info(f"Loading PyTorch, Transformers and {_model_name()} (first visit to this server only, about "
              f"{FIRST_LOAD_S} s)…", icon=":material/hourglass_top:")
    return slot


@contextmanager
def heavy_imports() -> Iterator[None]:
    """Hold the process's import turn for app.py's heavy imports (see the module's docstring)."""
    global _imported
    with _IMPORTING:
        yield
        _imported = True


@contextmanager
def first_run() -> Iterator[None]:
    """The process's first whole run holds the import turn; every later run goes straight through."""
    global _first_run_done
    if not _first_run_done:
        _IMPORTING.acquire()
        if not _first_run_done:
            try:
                yield
            finally:  # a first run that stops or reruns has still done its imports
                _first_run_done = True
                _IMPORTING.release()
            return
        _IMPORTING.release()  # another session's first run finished while this one waited
    yield


def done(note: Any) -> None:
    """Clear this session's first-run note (None: nothing to clear)."""
    if note is not None:
        note.empty()
