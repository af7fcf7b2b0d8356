"""The one way tests open a page of the real app in Streamlit's AppTest: app.py with the link's query parameters
and session state set first, then the page, checked for exceptions."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def open_page(page: str, title: str | None = None, *, model_id: str | None = None, model: str = "pretrained",
              query: dict[str, Any] | None = None, state: dict[str, Any] | None = None,
              timeout_s: float = 300) -> AppTest:
    """app.py on ``model`` (and ``model_id``; None: the deployment's default), with the link's ``query`` and the
    session's ``state`` set before the first run, then ``page``; fails on an exception, and on another title than
    ``title`` where one is given."""
    at = AppTest.from_file(APP, default_timeout=timeout_s)
    at.query_params["model"] = model
    if model_id is not None:
        at.query_params["model_id"] = model_id
    for name, value in (query or {}).items():
        at.query_params[name] = str(value)
    for key, value in (state or {}).items():
        at.session_state[key] = value
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    at.switch_page(page).run()
    assert not at.exception, [e.value for e in at.exception]
    if title is not None:
        assert at.title[0].value == title, [t.value for t in at.title]
    return at
