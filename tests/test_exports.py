"""Exports: every chart's camera button (PNG or SVG, a file name per chart) and bertviz views as offline HTML files."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest
from app_runs import rerun
from playwright.sync_api import TimeoutError as PlaywrightTimeoutError
from streamlit.testing.v1 import AppTest

from attention_explorer import views as bv
from attention_explorer.figures import plotly_config
from harness.browser import CHROMIUM, CHROMIUM_MISSING, wait_for_run
from ui.downloads import FORMAT_KEY

ROOT = Path(__file__).resolve().parents[1]
APP = str(ROOT / "app.py")
MAX_EXPORT_BYTES = 10_000_000
# Pages that draw no Plotly chart with the default model: bertviz's views are HTML (exported below), and the
# predictions page is for decoders (its two charts go through ui.analysis_widgets.show_figure, as every
# analysis page's do).
NO_CHARTS = {"pages/bertviz.py", "pages/predictions.py", "pages/attribution.py", "pages/patching.py",
             "pages/generate.py", "pages/kv_cache.py", "pages/circuits.py",  # the default model is BERT
             "pages/head_atlas.py"}  # no atlas until one is run


def _pages() -> list[str]:
    """The pages app.py lists, read from its source (importing app.py would run it)."""
    for node in ast.walk(ast.parse((ROOT / "app.py").read_text())):
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", None) == "PAGES":
            return [entry.elts[0].value for entry in node.value.elts]
    raise AssertionError("app.py has no PAGES list")


def _open(page: str) -> AppTest:
    at = rerun(AppTest.from_file(APP, default_timeout=180))
    if page != "pages/home.py":
        at.switch_page(page)
        rerun(at)
    return at


def _configs(at: AppTest) -> list[dict]:
    return [json.loads(chart.proto.config)["toImageButtonOptions"] for chart in at.get("plotly_chart")]


def test_plotly_config_downloads_a_safe_file_name_in_either_format():
    assert plotly_config("attention L3/H7", "svg")["toImageButtonOptions"] == {
        "format": "svg", "filename": "attention_L3_H7", "scale": 1}
    assert plotly_config("overview")["toImageButtonOptions"]["scale"] == 2  # PNG at twice the screen's pixels
    with pytest.raises(ValueError, match="png"):
        plotly_config("x", "jpeg")


@pytest.mark.slow
@pytest.mark.parametrize("page", _pages())
def test_every_chart_on_the_page_names_its_download_and_follows_the_sidebar_format(page):
    at = _open(page)
    before = _configs(at)
    assert bool(before) == (page not in NO_CHARTS), before
    for options in before:
        assert options["format"] == "png" and options["filename"], options
    at.sidebar.get("button_group")[0].set_value("svg")
    rerun(at)
    assert at.session_state[FORMAT_KEY] == "svg"
    after = _configs(at)
    assert len(after) == len(before)
    assert all(o["format"] == "svg" for o in after), after
    assert [o["filename"] for o in after] == [o["filename"] for o in before]


@pytest.mark.slow
def test_the_attention_pages_draw_charts_with_distinct_file_names():
    at = _open("pages/heatmaps.py")
    names = [o["filename"] for o in _configs(at)]
    # The overview, the focused head and the per-head summary (its four grids in one figure).
    assert len(names) == 3 and len(set(names)) == len(names), names


@pytest.fixture(scope="module")
def long_trace():
    import attention_explorer as ae

    text = " ".join(["The quick brown fox jumps over the lazy dog while the cat sleeps."] * 60)
    return ae.trace(text, truncate=True)


@pytest.mark.slow
def test_a_head_view_of_512_tokens_exports_within_10_mb(long_trace):
    assert long_trace.core.n_tokens == 512
    page = long_trace.head_view(layers=[0]).html
    size = len(page.encode())
    print(f"head view, 512 tokens, 12 heads, JavaScript inlined: {size / 1e6:.2f} MB")
    assert size <= MAX_EXPORT_BYTES
    assert "<script src=" not in page and "cdnjs" not in page


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason=CHROMIUM_MISSING)
@pytest.mark.parametrize("kind", bv.VIEW_KINDS)
def test_an_exported_view_draws_from_a_file_with_no_request(tmp_path, long_trace, browser, kind):
    view = {"head": lambda: long_trace.head_view(window=(0, 48)),
            "model": lambda: long_trace.model_view(window=(0, 24)),
            "neuron": lambda: long_trace.neuron_view(2, 5, window=(0, 24))}[kind]()
    path = view.save(tmp_path / f"{kind}.html")
    assert _draws_offline(browser, path) > 24


def _draws_offline(browser, path: Path) -> int:
    """Open a saved view in a fresh context; every request but the file's own is refused and recorded."""
    context = browser.new_context()
    outside, errors = [], []
    context.route("**/*", lambda route: route.continue_() if route.request.url == path.as_uri()
                  else (outside.append(route.request.url), route.abort()))
    try:
        page = context.new_page()
        page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(path.as_uri())
        page.locator("svg line").first.wait_for(state="attached", timeout=60_000)
        n_lines = page.evaluate("document.querySelectorAll('svg line').length")
    finally:
        context.close()
    assert outside == [] and errors == [], (outside, errors)
    return n_lines


@pytest.mark.browser
@pytest.mark.slow
@pytest.mark.skipif(not CHROMIUM.exists(), reason=CHROMIUM_MISSING)
@pytest.mark.parametrize("kind", ["head", "neuron"])
def test_the_bertviz_page_downloads_a_view_that_draws_offline(app_url, browser, tmp_path, kind):
    from test_bertviz_browser import Visit

    visit = Visit(browser, app_url)
    try:
        visit.open_view(kind, {"a": "time flies like an arrow", "b": "fruit flies like a banana"})
        download = None
        for _ in range(3):  # the button is drawn after the view: a click mid-run is lost on a busy machine, so again
            wait_for_run(visit.page, 120)
            try:
                with visit.page.expect_download(timeout=40_000) as download:
                    visit.page.get_by_role("button", name="Download this view").click()
                break
            except PlaywrightTimeoutError:
                download = None
        assert download is not None, "three clicks on 'Download this view' gave no download"
        name = download.value.suggested_filename
        path = tmp_path / name
        download.value.save_as(path)
    finally:
        visit.close()
    assert name == {"head": "bertviz_head_L0.html", "neuron": "bertviz_neuron_L0_H0.html"}[kind]
    assert _draws_offline(browser, path) >= 13 * 13  # every weight of a head, 13 tokens
