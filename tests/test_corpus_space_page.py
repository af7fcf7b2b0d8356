"""The Query–key space & nearest contexts page: AppTest, and a click on a point in the real browser."""

from __future__ import annotations

from pathlib import Path

import pytest
from streamlit.testing.v1 import AppTest

from harness.browser import CHROMIUM, AppServer, chromium, wait_for_run

pytestmark = pytest.mark.slow
APP = str(Path(__file__).resolve().parents[1] / "app.py")
RIVER = "we sat on the river bank"


def test_page_runs_the_demo_with_the_sidebars_model_and_finds_river_banks(tmp_path, monkeypatch):
    monkeypatch.setenv("AE_CORPUS_DIR", str(tmp_path / "runs"))
    at = AppTest.from_file(APP, default_timeout=240)
    at.session_state["ctl_text_a"] = RIVER
    at.session_state["ctl_text_b"] = ""
    at.switch_page("pages/corpus_space.py")
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert [h.value for h in at.header] == ["Query–key space & nearest contexts"]
    assert len(at.get("plotly_chart")) == 4  # the scatter, the layer grid, the word bars, the trend
    assert len(at.sidebar.selectbox(key="sel_head").options) == 12  # the one picker, in the sidebar
    assert not {"Layer", "Head"} & {s.label for s in at.main.selectbox}
    del at.session_state["_app_context"]  # AppTest runs a page alone after its first run (see test_pages.py)
    at.selectbox(key="space_position").set_value(6)  # "bank"
    at.run()
    assert not at.exception
    table = at.dataframe[0].value
    assert table["token"].iloc[0] == "bank"
    assert "river" in table["text"].iloc[0].lower()


@pytest.mark.browser
@pytest.mark.skipif(not CHROMIUM.exists(), reason="Chromium not installed: apt-get install chromium")
def test_a_grid_panel_enlarges_its_head_and_a_point_opens_its_text_with_that_head_in_focus(tmp_path):
    server = AppServer(tmp_path / "server.log", extra_env={"AE_CORPUS_DIR": str(tmp_path / "runs")})
    try:
        for browser in chromium():
            page = browser.new_page(viewport={"width": 1400, "height": 1200})
            errors = []
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(f"{server.url}/corpus_space?head=4", wait_until="domcontentloaded")
            page.get_by_text("Layer 0, head 4: ").wait_for(timeout=240_000)
            wait_for_run(page, 240)
            # The layer grid: a click on head 7's panel enlarges head 7 in the scatter.
            grid = page.locator('[data-testid="stMain"] .js-plotly-plot').nth(1)
            grid.scroll_into_view_if_needed()
            page.wait_for_timeout(1000)
            xy = grid.evaluate("""gd => {
                const t = gd._fullData[14], xa = gd._fullLayout[t.xaxis.replace('x', 'xaxis')],
                      ya = gd._fullLayout[t.yaxis.replace('y', 'yaxis')], r = gd.getBoundingClientRect();
                return [r.left + xa._offset + xa.l2p(t.x[0]), r.top + ya._offset + ya.l2p(t.y[0])];
            }""")
            page.mouse.click(xy[0], xy[1])
            page.get_by_text("Layer 0, head 7: ").wait_for(timeout=120_000)
            wait_for_run(page, 240)
            plot = page.locator('[data-testid="stMain"] .js-plotly-plot').first
            plot.scroll_into_view_if_needed()
            page.wait_for_timeout(1000)
            # Click the first query point where plotly drew it: its data coordinates through the axes.
            xy = plot.evaluate("""gd => {
                const t = gd._fullData[0], xa = gd._fullLayout.xaxis, ya = gd._fullLayout.yaxis;
                const r = gd.getBoundingClientRect();
                return [r.left + xa._offset + xa.l2p(t.x[0]), r.top + ya._offset + ya.l2p(t.y[0])];
            }""")
            page.mouse.click(xy[0], xy[1])
            page.wait_for_function("() => location.pathname.endsWith('/heatmaps')", timeout=120_000)
            wait_for_run(page, 240)
            assert page.locator('section[data-testid="stSidebar"] textarea').first.input_value()
            page.get_by_role("heading", name="Layer 0, head 7").wait_for(timeout=60_000)
            assert page.locator('[data-testid="stException"]').count() == 0
            assert not errors, errors
    finally:
        server.stop()
