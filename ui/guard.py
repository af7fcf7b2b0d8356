"""view_guard: one failing view shows a short error and the views after it still draw."""

from __future__ import annotations

import logging
from contextlib import contextmanager
from typing import Iterator

import streamlit as st
from streamlit.runtime.scriptrunner_utils.exceptions import ScriptControlException

from model_core.models.run_memory import after_out_of_memory, out_of_memory

LOG = logging.getLogger("attention_explorer.views")

# Streamlit's st.rerun/st.stop and st.switch_page are control flow, not failures: let them through.
_CONTROL_FLOW: tuple[type[BaseException], ...] = (ScriptControlException,)


def view_error_message(name: str, exc: BaseException) -> str:
    """The short text the user sees; the traceback stays in the server log."""
    detail = str(exc).splitlines()[0][:200] if str(exc) else ""
    return (f"The {name} view failed ({type(exc).__name__}{': ' + detail if detail else ''}). "
            "The other views on this page are unaffected; try another layer, head or text.")


@contextmanager
def view_guard(name: str) -> Iterator[None]:
    """Run one view; on any exception show ``st.error`` with a short message and carry on.

    Usage::

        with view_guard("focused heatmap"):
            st.plotly_chart(attention_heatmap(...))

    Streamlit's control flow (``st.rerun``, ``st.stop``, ``st.switch_page``) passes through.
    """
    try:
        yield
    except _CONTROL_FLOW:
        raise
    except Exception as exc:  # noqa: BLE001 - the point is that one view cannot take the page down
        if out_of_memory(exc):  # not this view's fault: said as such, and a GPU's cached blocks given back
            LOG.warning("view %r ran out of memory: %s", name, exc)
            st.error(after_out_of_memory(exc), icon=":material/error:")
            return
        LOG.exception("view %r failed", name)
        st.error(view_error_message(name, exc), icon=":material/error:")


@contextmanager
def memory_guard() -> Iterator[None]:
    """A fragment's body (``@st.fragment`` on top, then ``@memory_guard()``): a fragment reruns alone when its own
    widget changes, outside app.py's handler of a whole run, so an out-of-memory there would show Streamlit's
    traceback. Here it is said in one paragraph and a GPU's cached blocks are given back; any other error goes on.
    """
    try:
        yield
    except (RuntimeError, MemoryError) as exc:  # torch's OutOfMemoryError is a RuntimeError
        if not out_of_memory(exc):
            raise
        LOG.warning("a fragment ran out of memory: %s", exc)
        st.error(after_out_of_memory(exc), icon=":material/memory:")
