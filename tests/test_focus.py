"""The one home of the focused layer and head (ui/focus.py), and app.py's PAGES saying which pages draw its picker."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from ui.focus import Focus

ROOT = Path(__file__).resolve().parents[1]


def _pages() -> list[tuple[str, str, str, str, bool]]:
    tree = ast.parse((ROOT / "app.py").read_text())
    return next(ast.literal_eval(node.value) for node in tree.body if isinstance(node, ast.Assign)
                and any(getattr(t, "id", None) == "PAGES" for t in node.targets))


def test_a_focus_counts_from_zero():
    assert Focus(2, 3) == Focus(layer=2, head=3) and Focus() == Focus(0, 0)
    with pytest.raises(ValueError, match="count from 0"):
        Focus(-1, 0)


def test_a_page_draws_the_picker_itself_exactly_when_its_entry_in_pages_says_so():
    # A page that says so and draws none would leave the sidebar without a picker; one that draws it unannounced
    # would draw it twice (app.py draws it for every page whose entry says False).
    for path, _, _, _, draws in _pages():
        source = (ROOT / path).read_text()
        assert ("head_fragment(" in source) == draws, path
        for second in ('selectbox("Layer"', 'selectbox("Head"'):
            assert second not in source, f"{path} draws a second picker; read ui.focus.get_focus or use head_fragment"


def _focus_script() -> None:
    import streamlit as st

    from ui.focus import clamp_focus, focus_picker, get_focus, set_focus

    if st.session_state.get("click"):
        set_focus(*st.session_state.pop("click"))
    st.session_state["before"] = get_focus()
    if not st.session_state.get("hide"):  # a run that draws no picker, as a page change is to a fragment's picker
        st.session_state["clamped"] = clamp_focus(3, 4)
        st.session_state["shown"] = focus_picker(3, 4)


def test_set_focus_moves_the_picker_and_clamp_focus_holds_it_to_the_model():
    at = AppTest.from_function(_focus_script).run()
    assert at.session_state["shown"] == Focus(0, 0)
    at.session_state["click"] = (2, 3)
    at.run()
    assert (at.selectbox(key="sel_layer").value, at.selectbox(key="sel_head").value) == (2, 3)
    at.session_state["click"] = (9, 1)  # a link or a corpus run may name a layer this model lacks
    at.run()
    assert at.session_state["before"] == Focus(9, 1) and at.session_state["shown"] == Focus(2, 1)
    assert [t.value for t in at.toast] == ["Layer 9 does not exist in this model (layers 0-2); showing layer 2."]


def test_the_kept_focus_comes_back_when_streamlit_dropped_the_pickers_state():
    at = AppTest.from_function(_focus_script).run()
    at.selectbox(key="sel_head").set_value(3).run()
    at.session_state["hide"] = True  # a run that draws no picker: Streamlit then drops its state
    at.run()
    at.session_state["hide"] = False
    at.run()
    assert at.session_state["before"] == Focus(0, 3) and at.selectbox(key="sel_head").value == 3


@pytest.mark.slow
@pytest.mark.browser
def test_head_statistics_open_the_sidebars_head_in_the_heatmaps_in_chromium(app_url, browser):
    """A link's head is the page's; the sidebar's picker (the only one) moves it, reruns only its fragment, and the
    button opens that head in the heatmaps, with the link following."""
    from harness.browser import CHROMIUM, wait_for_run

    if not CHROMIUM.exists():
        pytest.skip("Chromium not installed: apt-get install chromium")
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    try:
        page.goto(f"{app_url}/analysis_head_stats?layer=2&head=5", wait_until="domcontentloaded")
        page.get_by_role("button", name="Open layer 2, head 5 in the heatmaps").wait_for(timeout=180_000)
        wait_for_run(page, 180, 2.0)
        combo = page.locator('section[data-testid="stSidebar"] input[role="combobox"][aria-label="Head"]')
        combo.click()
        combo.press("ArrowDown")
        page.locator('[role="listbox"] [role="option"][data-key="7"]').click()
        page.get_by_role("button", name="Open layer 2, head 7 in the heatmaps").click(timeout=60_000)
        page.get_by_role("heading", name="Layer 2, head 7").wait_for(timeout=120_000)
        assert "layer=2" in page.url and "head=7" in page.url
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        context.close()
