"""The app's only uses of Streamlit's private internals (no public API does these jobs in Streamlit 1.67).

``tests/test_st_private.py`` pins each to the names it reads and checks that it still does its job, so an upgrade
of Streamlit that changes them fails the tests instead of bringing back a leak or a blank page in silence.
"""

from __future__ import annotations

import logging
import threading

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import StopException
from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequestType
from streamlit.runtime.scriptrunner_utils.script_run_context import get_script_run_ctx

_log = logging.getLogger(__name__)
_warned: list[str] = []  # the widget-state warning, given once
_stop_warned: list[str] = []  # the script-requests warning, given once


def leave_legacy_pages_mode() -> None:
    """Switch Streamlit's legacy multipage mode off, as ``st.navigation`` does, and rerun through app.py.

    Legacy mode runs a ``pages/`` script alone when a fresh server's first visitor opens a sub-page URL, before
    app.py has ever called ``st.navigation``; the page then has no context.

    Raises:
        RuntimeError: Streamlit no longer has the flag; without it the page would rerun alone for ever.
    """
    from streamlit.runtime.pages_manager import PagesManager

    if not hasattr(PagesManager, "uses_pages_directory"):
        raise RuntimeError("Streamlit's PagesManager has no `uses_pages_directory` any more: see how "
                           "streamlit/commands/navigation.py leaves legacy multipage mode, and do the same in "
                           "ui/st_private.py.")
    PagesManager.uses_pages_directory = False
    st.rerun()


def drop_stale_widget_callbacks(at_end: bool = False) -> int:
    """Forget the callbacks of widgets that are gone; the number of callbacks forgotten.

    Streamlit 1.67 removes a stale widget's value after a run but keeps its metadata, callback included, for the
    session's life. A callback defined in a page script points at that run's page globals, and they hold its trace:
    the overview's click callback (its widget id changes with the figure) kept every earlier text's trace of a tab
    alive, 0.4 GB each for SmolLM2 at 512 tokens. At the start of a run (``at_end`` False) this drops the metadata
    of widgets Streamlit has already dropped; at the normal end of a full run, that of widgets this run did not
    draw, which Streamlit is about to drop. Where Streamlit's private state is not as expected it logs a warning
    once and does nothing (the tests fail then). (A fragment with ``parallel=True`` would register its widgets
    after the script returns; the app has none, and one would need the end-of-run call skipped.)
    """
    try:
        from streamlit.runtime.state.session_state_proxy import get_session_state

        run = get_script_run_ctx()
        if run is None or (at_end and run.fragment_ids_this_run):
            return 0
        safe = get_session_state()
        with safe._lock:
            state = safe._state
            widgets = state._new_widget_state
            if at_end:
                keep = set(run.shared.widget_ids_this_run.snapshot())
            else:
                keep = set(widgets.states) | set(state._old_state)
            gone = [wid for wid in widgets.widget_metadata if wid not in keep]
            callbacks = sum(widgets.widget_metadata[wid].callback is not None for wid in gone)
            for wid in gone:
                del widgets.widget_metadata[wid]
            return callbacks
    except (AttributeError, ImportError, TypeError) as exc:
        if not _warned:
            _warned.append(str(exc))
            _log.warning("Streamlit's private widget state changed (%s): stale widget callbacks, and the traces "
                         "they hold, are kept for the session's life. Update ui/st_private.py.", exc)
        return 0


SCRIPT_THREAD = "ScriptRunner.scriptThread"
"""The name Streamlit gives the thread that runs a session's script (a whole run or a fragment's)."""


def stop_requested() -> bool:
    """Whether Streamlit was asked to stop this script run: its own Stop (the status widget's, while a script runs)
    or the session ending (the tab closed). Read without taking the request, and a rerun request is not a stop: a
    click meanwhile lets a cached computation finish and be kept, and the rerun then finds it. False outside a
    Streamlit run, or (with a warning, once) where Streamlit's private state is not as expected."""
    try:
        run = get_script_run_ctx(suppress_warning=True)
        requests = None if run is None else run.script_requests
        return requests is not None and requests._state == ScriptRequestType.STOP
    except AttributeError as exc:
        if not _stop_warned:
            _stop_warned.append(str(exc))
            _log.warning("Streamlit's private script requests changed (%s): a Stop no longer ends a computation "
                         "that draws nothing. Update ui/st_private.py.", exc)
        return False


def stop_if_asked() -> None:
    """In a script thread, stop the run now if Streamlit was asked to (``stop_requested``); elsewhere (a worker
    thread a page started) nothing. The app's stop check (``model_core.gate.set_stop_check``): a pretrained model's
    pass ends at its next layer, the composition scores at their next step. Streamlit keeps a stop request until
    the run ends, so the session-state read below, a yield point of Streamlit's, raises its StopException."""
    if threading.current_thread().name != SCRIPT_THREAD or not stop_requested():
        return
    _ = "_" in st.session_state
    raise StopException()  # where that read is no yield point (no script is executing): stop all the same
