"""The real app.py run once through Streamlit's AppTest, with session state and link parameters set first."""

from __future__ import annotations

import base64
from pathlib import Path

import numpy as np
from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def run_app(state: dict | None = None, query: dict | None = None, *, timeout: float = 180) -> AppTest:
    """app.py after one run with ``state`` in session state and ``query`` in the link; it raised nothing."""
    at = AppTest.from_file(APP, default_timeout=timeout)
    for key, value in (state or {}).items():
        at.session_state[key] = value
    for key, value in (query or {}).items():
        at.query_params[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def rerun(at: AppTest) -> AppTest:
    """One more run of app.py and its page; the context stored by the last run goes first (tests/test_pages.py
    says why); it raised nothing."""
    if "_app_context" in at.session_state:
        del at.session_state["_app_context"]
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    return at


def open_page(page: str, query: dict | None = None, state: dict | None = None, *, timeout: float = 180) -> AppTest:
    """app.py with ``query`` in its link and ``state`` in session state, run once, then switched to ``page`` (its
    path, e.g. "pages/kv_cache.py") and run again; neither run raised."""
    at = run_app(state, query, timeout=timeout)
    at.switch_page(page)
    return rerun(at)


def plotly_z(spec: dict) -> np.ndarray:
    """A Plotly trace's z (from ``json.loads(chart.proto.spec)["data"][i]``) as numbers: Plotly sends float32 as a
    base64 typed array, other values as lists."""
    z = spec["z"]
    if isinstance(z, dict):
        shape = tuple(int(n) for n in str(z["shape"]).split(","))
        return np.frombuffer(base64.b64decode(z["bdata"]), dtype=z["dtype"]).reshape(shape)
    return np.asarray(z, dtype=np.float64)
