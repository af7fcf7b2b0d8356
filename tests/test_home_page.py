"""The Home page: a figure on a first visit, a link to every page of app.py's PAGES, the two "start here" paths with
their model buttons (AppTest), and the figure and paths above the fold at 1440 × 1000 (headless Chromium)."""

from __future__ import annotations

import pytest
from streamlit.testing.v1 import AppTest

from harness.apptest import APP
from harness.browser import CHROMIUM, CHROMIUM_MISSING, app_pages, open_chromium, wait_for_run
from ui.home import CHAPTER_3, DECODER, NOTES

TITLES = dict(app_pages())  # read from app.py's source, apart from the page under test


def _first_visit() -> AppTest:
    at = AppTest.from_file(APP, default_timeout=300)
    at.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    return at


def _links(at: AppTest) -> list:
    return at.get("page_link")


def test_a_first_visit_draws_a_figure_and_links_every_page():
    at = _first_visit()
    assert [t.value for t in at.title] == ["Attention Explorer"]
    assert len(at.get("plotly_chart")) == 1  # the focused head's heatmap of the default pair
    labels = [link.proto.label for link in _links(at)]
    assert sorted(set(TITLES.values()) - set(labels)) == []  # every page, by its app.py title
    pages = {link.proto.label.split(". ", 1)[-1]: link.proto.page_script_hash for link in _links(at)}
    assert len(set(pages.values())) == len(pages) and "" not in pages.values()  # each title, its own page
    assert sorted(set(TITLES) - set(NOTES)) == []  # one line on every page (ui/home.py's NOTES)


def test_the_start_here_paths_link_their_pages_in_order_and_switch_the_model():
    at = _first_visit()
    labels = [link.proto.label for link in _links(at)]
    for path in (CHAPTER_3, DECODER):
        shown = [f"{n}. {TITLES[p]}" for n, p in enumerate(path, 1)]
        assert 4 <= len(path) <= 5 and all(label in labels for label in shown), shown
    del at.session_state["_app_context"]  # the next run goes through app.py (see tests/test_pages.py)
    at.button(key="home_use_custom").click().run()
    assert not at.exception, [e.value for e in at.exception]
    assert at.session_state["_app_context"].trace.model_kind == "custom"
    assert len(at.get("plotly_chart")) == 1
    assert not any(b.key == "home_use_custom" for b in at.button)  # the sidebar has it now


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason=CHROMIUM_MISSING)
def test_the_figure_and_both_paths_are_above_the_fold_at_1440_by_1000(app_server):
    with open_chromium() as browser:
        page = browser.new_page(viewport={"width": 1440, "height": 1000})
        page.goto(app_server.url + "/")
        wait_for_run(page, selector='[data-testid="stPlotlyChart"]')
        figure = page.locator('[data-testid="stPlotlyChart"]').first.bounding_box()
        assert figure is not None and figure["height"] > 300
        assert 0 <= figure["y"] and figure["y"] + figure["height"] <= 1000, figure  # no scrolling to see it
        last = page.get_by_role("link", name=f"5. {TITLES[DECODER[-1]]}").bounding_box()
        assert last is not None and last["y"] + last["height"] <= 1000, last  # both paths too
        page.get_by_role("link", name=f"2. {TITLES[DECODER[1]]}").click()  # a link opens its page
        wait_for_run(page, selector="h1", text=TITLES[DECODER[1]])
        assert page.locator('[data-testid="stException"]').count() == 0
