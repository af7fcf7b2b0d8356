"""ui.guard.view_guard: one failing view shows a short error and the next view is still drawn."""

from __future__ import annotations

import logging
from pathlib import Path

from streamlit.testing.v1 import AppTest

APP = str(Path(__file__).resolve().parents[1] / "app.py")


def _two_views_script() -> None:
    import streamlit as st

    from ui.guard import view_guard

    with view_guard("first"):
        st.markdown("first started")
        raise ZeroDivisionError("boom in the first view")
    with view_guard("second"):
        st.markdown("second drawn")


def _rerun_script() -> None:
    import streamlit as st

    from ui.guard import view_guard

    st.session_state.setdefault("runs", 0)
    st.session_state["runs"] += 1
    with view_guard("rerunning"):
        if st.session_state["runs"] == 1:
            st.rerun()
    with view_guard("stopping"):
        st.stop()
    st.markdown("after stop")


def test_a_failing_view_shows_a_short_error_and_the_next_view_draws(caplog):
    at = AppTest.from_function(_two_views_script)
    with caplog.at_level(logging.ERROR, logger="attention_explorer.views"):
        at.run()
    assert not at.exception
    assert [m.value for m in at.markdown] == ["first started", "second drawn"]
    assert len(at.error) == 1
    message = at.error[0].value
    assert "first view failed" in message and "ZeroDivisionError" in message and "boom" in message
    assert "Traceback" not in message
    # The traceback goes to the server log, not to the page.
    assert any("Traceback" in (r.exc_text or "") or r.exc_info for r in caplog.records)


def test_rerun_and_stop_pass_through_the_guard():
    at = AppTest.from_function(_rerun_script).run()
    assert not at.exception and not at.error
    assert at.session_state["runs"] == 2  # st.rerun() was not swallowed
    assert not [m.value for m in at.markdown]  # st.stop() was not swallowed


def test_heatmaps_page_keeps_its_other_views_when_the_overview_fails(monkeypatch):
    """Fault injection on the real page: the overview builder raises; the focus and summary still draw."""
    import attention_explorer.figures

    def broken(*_args, **_kwargs):
        raise RuntimeError("overview exploded")

    at = AppTest.from_file(APP, default_timeout=120)
    at.run()
    assert not at.exception
    monkeypatch.setattr(attention_explorer.figures, "overview_mosaic", broken)
    at.switch_page("pages/heatmaps.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert len(at.error) == 1 and "overview view failed" in at.error[0].value
    keys = [c.proto.id for c in at.get("plotly_chart")]
    # The focused heatmap and the per-head summary (its four grids in one figure) are still drawn.
    assert len(keys) == 2 and keys[0].endswith("-focus") and keys[1].endswith("-head_summary"), keys
    assert [s.value for s in at.subheader][-1] == "Per-head summary"
