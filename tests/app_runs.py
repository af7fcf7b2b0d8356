"""The real app.py run once through Streamlit's AppTest, with session state and link parameters set first."""

from __future__ import annotations

from pathlib import Path

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
