"""ui/st_private.py's uses of Streamlit's private internals: the names each reads exist in this Streamlit, and each
still does its job in a real AppTest run. An upgrade that changes them fails here, not in silence."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")
SMALL = {"ctl_model": "custom", "ctl_num_hidden_layers": 2, "ctl_num_attention_heads": 2, "ctl_hidden_size": 32}


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_the_widget_state_drop_stale_widget_callbacks_reads_is_there():
    from streamlit.runtime.scriptrunner_utils.script_run_context import ScriptRunContext
    from streamlit.runtime.scriptrunner_utils.shared_run_state import SharedRunState
    from streamlit.runtime.state.common import WidgetMetadata
    from streamlit.runtime.state.safe_session_state import SafeSessionState
    from streamlit.runtime.state.session_state import SessionState, WStates

    assert {"_lock", "_state"} <= set(SafeSessionState.__annotations__)
    assert {"_old_state", "_new_widget_state"} <= _fields(SessionState)
    assert {"states", "widget_metadata"} <= _fields(WStates)
    assert "callback" in _fields(WidgetMetadata)
    assert {"fragment_ids_this_run", "shared"} <= _fields(ScriptRunContext)
    assert callable(SharedRunState().widget_ids_this_run.snapshot)


def _forgetting_script() -> None:
    import streamlit as st

    from ui.st_private import drop_stale_widget_callbacks

    st.session_state["at_start"] = drop_stale_widget_callbacks()
    if st.session_state.get("draw", True):
        st.button("With a callback", key="go", on_click=lambda: None)
        st.button("Without one", key="plain")
    if st.session_state.get("at_end", True):
        st.session_state["at_end_count"] = drop_stale_widget_callbacks(at_end=True)


def test_drop_stale_widget_callbacks_forgets_the_callback_of_a_widget_this_run_did_not_draw():
    at = AppTest.from_function(_forgetting_script).run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["at_end_count"] == 0  # both buttons were drawn
    at.session_state["draw"] = False
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["at_end_count"] == 1  # "go"'s callback; "plain" had none
    at.run()
    assert (at.session_state["at_start"], at.session_state["at_end_count"]) == (0, 0)  # nothing is left


def test_drop_stale_widget_callbacks_at_the_start_of_a_run_forgets_what_streamlit_dropped():
    at = AppTest.from_function(_forgetting_script)
    at.session_state["at_end"] = False
    at.run()
    at.session_state["draw"] = False
    at.run()  # Streamlit drops the buttons' values after this run, and keeps their metadata
    assert at.session_state["at_start"] == 0
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["at_start"] == 1


def test_the_legacy_pages_flag_leave_legacy_pages_mode_sets_is_the_one_streamlit_reads():
    from streamlit.commands import navigation
    from streamlit.runtime.pages_manager import PagesManager
    from streamlit.runtime.scriptrunner import script_runner

    assert "uses_pages_directory" in vars(PagesManager)
    assert "PagesManager.uses_pages_directory" in inspect.getsource(script_runner)
    assert "PagesManager.uses_pages_directory = False" in inspect.getsource(navigation)


def test_a_page_run_alone_reruns_through_app_py():
    """AppTest runs a page file alone after its first run (legacy multipage mode, as a fresh server does for its
    first visitor's sub-page URL): ``get_context`` must leave that mode and rerun through app.py."""
    at = AppTest.from_file(APP, default_timeout=180)
    for key, value in SMALL.items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page("pages/bertviz.py")
    del at.session_state["_app_context"]
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.sidebar.radio(key="ctl_model").value == "custom"  # app.py's sidebar was drawn
    assert at.title[0].value == "bertviz views"


def test_the_script_requests_stop_requested_reads_are_there():
    from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequests, ScriptRequestType
    from streamlit.runtime.scriptrunner_utils.script_run_context import ScriptRunContext

    assert "script_requests" in _fields(ScriptRunContext)
    requests = ScriptRequests()
    assert requests._state == ScriptRequestType.CONTINUE
    requests.request_stop()
    assert requests._state == ScriptRequestType.STOP


def _stopping_script() -> None:
    import threading

    import streamlit as st
    from streamlit.runtime.scriptrunner_utils.exceptions import StopException
    from streamlit.runtime.scriptrunner_utils.script_requests import ScriptRequestType
    from streamlit.runtime.scriptrunner_utils.script_run_context import add_script_run_ctx, get_script_run_ctx

    from model_core.gate import checkpoint, set_stop_check
    from ui.st_private import SCRIPT_THREAD, stop_if_asked, stop_requested

    requests = get_script_run_ctx().script_requests
    set_stop_check(stop_if_asked)  # as app.py does
    try:
        checkpoint()  # nothing asked: goes on
        st.session_state["before"] = stop_requested()
        st.session_state["thread"] = threading.current_thread().name == SCRIPT_THREAD
        if st.session_state.get("ask") == "rerun":  # a click meanwhile: not a stop, the work goes on
            requests.request_rerun(requests._rerun_data)
            rerun_is_stop = stop_requested()
            checkpoint()  # no exception
            requests._state = ScriptRequestType.CONTINUE  # this test's reset: else the next write reruns the script
            st.session_state["rerun_is_stop"], st.session_state["after_rerun"] = rerun_is_stop, True
        if st.session_state.get("ask") == "stop":  # Streamlit's Stop, or the tab closed
            requests.request_stop()
            in_worker = []  # a thread the page started, with the run's context: the stop is not its to raise
            worker = threading.Thread(target=lambda: in_worker.append((stop_requested(), checkpoint())))
            add_script_run_ctx(worker)
            worker.start()
            worker.join(10)
            try:
                checkpoint()  # raises StopException: nothing below runs
                st.session_state["after_stop"] = True
            except StopException:
                requests._state = ScriptRequestType.CONTINUE  # this test's reset: AppTest waits for a run's end
                st.session_state["stopped"], st.session_state["in_worker"] = True, in_worker
    finally:
        set_stop_check(None)


def test_a_stop_request_ends_the_run_at_the_next_checkpoint_and_a_rerun_request_does_not():
    """In the script's thread a stop request ends the run at the next checkpoint, and a rerun request does not; in a
    worker thread that carries the run's context, the stop is seen but not raised (the worker's work goes on)."""
    at = AppTest.from_function(_stopping_script, default_timeout=30).run()
    assert not at.exception and at.session_state["before"] is False and at.session_state["thread"] is True
    at.session_state["ask"] = "stop"
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["stopped"] is True and "after_stop" not in at.session_state
    assert at.session_state["in_worker"] == [(True, None)]
    at.session_state["ask"] = "rerun"
    at.run()
    assert at.session_state["rerun_is_stop"] is False and at.session_state["after_rerun"] is True
