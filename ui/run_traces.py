"""The traces a script run holds: held for the run, let go at its end, so only the cache's byte budget keeps them.

A session's state, and a page's globals (which its fragments, widget callbacks and downloads keep alive after the
run), outlive the run: a trace held there (0.3 GB for SmolLM2 at 400 tokens) escaped ``ui.loaders.TRACES``'s budget,
so eight idle tabs held eight traces. So the run's context names its trace by its cache key (``ui.context``); the
script thread holds what it read (``hold``, ``resolve``); at the run's end ``release_run`` lets it go and takes the
traces out of the page's globals; a fragment's rerun puts them back from the cache, or reruns the whole page (whose
app.py builds the trace again in its turn at the gate) when the cache let one go (``page_traces``).
"""

from __future__ import annotations

import contextlib
import functools
import threading
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

import streamlit as st

from model_core import AttentionTrace, TraceRequest
from model_core.compact.trace import CompactTrace

F = TypeVar("F", bound=Callable[..., Any])
Trace = AttentionTrace | CompactTrace

TraceKind = Literal["full", "compact"]
TraceKey = tuple[str, TraceRequest]
"""("full" | "compact", request): a trace's key in ``ui.loaders.TRACES``."""

RELEASED = "__released_traces__"
"""In a page's globals after its run: {global name: trace key} of the traces ``release_run`` took out."""

_RUN = threading.local()  # this script thread's run: what it holds (key -> trace), its pages' globals, a full run?


def _run() -> threading.local:
    if not hasattr(_RUN, "held"):
        _RUN.held, _RUN.pages, _RUN.full = {}, [], False
    return _RUN


def _in_script_run() -> bool:
    from streamlit.runtime.scriptrunner import get_script_run_ctx

    return get_script_run_ctx(suppress_warning=True) is not None


class _Missing(Exception):
    """The trace is not in the cache (``_cached``)."""


def _cached(key: TraceKey) -> Trace | None:
    """The cached trace of ``key`` (or one the cache let go that something still holds), or None; never builds."""
    from ui.loaders import TRACES

    def missing() -> Any:
        raise _Missing

    try:
        return TRACES.get(key, missing)
    except _Missing:
        return None


def _build_quietly(key: TraceKey) -> AttentionTrace:
    """Outside a script run (a download's data, a test): build a full trace again, with no page to draw on; the
    route still takes its turn at the gate."""
    from model_core import build_trace
    from ui.loaders import CACHED_MODELS, TRACES

    kind, request = key
    if kind != "full":
        raise LookupError("This long text's compact trace is no longer cached: reload the page to build it again.")
    return TRACES.get(key, lambda: build_trace(request, models=CACHED_MODELS))


def begin_run() -> None:
    """A full run (app.py) starts: the page's globals stay whole until ``release_run``."""
    _run().full = True


def hold(key: TraceKey, trace: Trace) -> None:
    """Hold ``trace`` (the cache's entry for ``key``) for the rest of this script run: every read of it in the run
    is the same object, however the cache changes meanwhile (app.py, once it has the trace)."""
    _run().held[key] = trace


def resolve(key: TraceKey) -> Trace:
    """The trace of ``key``: the one this run holds, else the cache's (then held for the run).

    When the cache let it go: in a script run (a fragment's rerun), rerun the whole page, whose app.py builds it
    again in its turn at the gate with the queue's note; outside one (a download's data, a test), build it here."""
    held = _run().held
    if key in held:
        return held[key]
    trace = _cached(key)
    in_run = _in_script_run()
    if trace is None and in_run:
        st.rerun(scope="app")  # from a widget callback too: Streamlit ends the callback and reruns
    if trace is None:
        trace = _build_quietly(key)
    if in_run:  # never in a server thread that outlives the run
        held[key] = trace
    return trace


def track_page(page_globals: dict) -> None:
    """Remember the globals of the page script that asked for the context, so ``release_run`` can clear them. Other
    modules' globals are left alone."""
    if page_globals.get("__name__") == "__main__" and "__file__" in page_globals:  # st.navigation's page scripts
        pages = _run().pages
        if not any(page is page_globals for page in pages):
            pages.append(page_globals)


def _release_globals(page_globals: dict) -> None:
    """Take the traces this run holds out of a page's globals, noting their keys (``RELEASED``)."""
    keys = {id(trace): key for key, trace in _run().held.items()}
    released = page_globals.setdefault(RELEASED, {})
    for name, value in list(page_globals.items()):
        key = keys.get(id(value))
        if key is not None:
            released[name] = key
            del page_globals[name]


def release_run() -> None:
    """At the end of a full run (app.py): take the run's traces out of its page's globals and let them go, so an
    idle session holds no trace and the cache's budget bounds them all."""
    run = _run()
    for page_globals in run.pages:
        _release_globals(page_globals)
    run.held, run.pages, run.full = {}, [], False


@contextlib.contextmanager
def page_traces(page_globals: dict) -> Iterator[None]:
    """Around a fragment's rerun of a page function whose globals are ``page_globals``: the page's traces back in
    its globals for the rerun (from the cache; a whole-page rerun when the cache let one go), and out after it.

    Within the full run (the fragment's first call) the globals are whole and this does nothing."""
    run = _run()
    if run.full or RELEASED not in page_globals:
        yield
        return
    released = dict(page_globals[RELEASED])
    for name, key in released.items():
        page_globals[name] = resolve(key)
    try:
        yield
    finally:
        for name in released:
            page_globals.pop(name, None)
        _release_globals(page_globals)  # and any trace the rerun bound anew
        run.held = {}


def with_page_traces(fn: F) -> F:
    """Decorate a page's function that a fragment reruns (``st.fragment`` on top): ``page_traces`` around it."""

    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
        with page_traces(fn.__globals__):
            return fn(*args, **kwargs)

    return call  # type: ignore[return-value]
