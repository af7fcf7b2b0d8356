"""Every page of app.py's PAGES in headless Chromium: it finishes, draws a figure, shows no error.

The app starts as ``make run`` starts it (``.venv/bin/streamlit run app.py``), headless on a free
port. With ``$AE_SCREENSHOT_DIR`` set, each page is also shot there at its full height (the picture costs the
browser seconds a page, so a plain run takes none). Requests
that leave 127.0.0.1 are recorded in ``outside_requests.json`` there and reported as a warning,
not a failure: the zero-outside-requests test lives elsewhere.
"""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path
from urllib.parse import urlparse

import pytest

pytestmark = [pytest.mark.browser, pytest.mark.slow]

from harness.browser import CHROMIUM, CHROMIUM_MISSING, app_pages, nav_to, wait_for_run

LOCAL_HOSTS = {"127.0.0.1", "localhost", "::1", "[::1]"}
PAGE_TIMEOUT_S = 180
QUIET_S = 2.0
# Pages that by design draw their figures only after the user picks something; the message they
# show instead must be there.
NO_FIGURE_UNTIL_INPUT: dict[str, str] = {  # page file -> the message it shows instead of a figure
    "pages/predictions.py": "do not predict next tokens",  # the default model is the bundled BERT
    "pages/attribution.py": "predicts no next token",
    "pages/patching.py": "predicts no next token",
    "pages/generate.py": "reads a whole text at once",
    "pages/kv_cache.py": "has no KV cache",
    "pages/circuits.py": "predicts no next token",
    "pages/head_atlas.py": "No atlas of this model yet",
}
# Streamlit's frontend, opened at /<page>, first probes /<page>/_stcore/... to find the app's base
# path; the 404s it logs for those probes are Streamlit's, not ours.
BASE_PATH_PROBES = ("/_stcore/health", "/_stcore/host-config")  # the status widget must stay away this long before a run counts as finished

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)


PAGES = app_pages()


def _url_path(page: str) -> str:
    return "" if page == "pages/home.py" else Path(page).stem  # home is the default page, at /


@pytest.fixture(scope="module")
def screenshot_dir() -> Path | None:
    folder = os.environ.get("AE_SCREENSHOT_DIR")
    if not folder:
        return None
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope="module")
def outside_requests(screenshot_dir, tmp_path_factory):
    """page -> URLs it requested outside 127.0.0.1; written out and warned about at the end."""
    seen: dict[str, list[str]] = {}
    yield seen
    outside = {page: sorted(set(urls)) for page, urls in seen.items() if urls}
    folder = screenshot_dir or tmp_path_factory.mktemp("smoke")
    (folder / "outside_requests.json").write_text(json.dumps(outside, indent=2))
    if outside:
        warnings.warn(f"requests leaving 127.0.0.1: {json.dumps(outside)}", stacklevel=1)


def _wait_for_run(page, timeout_s: float) -> None:
    wait_for_run(page, timeout_s, QUIET_S)


SCROLL_HEIGHT_JS = """() => Math.max(1000, ...["stAppViewContainer", "stMain", "stMainBlockContainer"].map(
    id => (document.querySelector(`[data-testid="${id}"]`) || {scrollHeight: 0}).scrollHeight))"""
def _is_base_path_probe(message, page_file: str) -> bool:
    url = urlparse(message.location.get("url") or "")
    prefix = f"/{_url_path(page_file)}"
    return ("404" in message.text and url.hostname in LOCAL_HOSTS and prefix != "/"
            and url.path in {prefix + probe for probe in BASE_PATH_PROBES})


FIGURES = ('[data-testid="stMain"] .main-svg, [data-testid="stMain"] iframe, '
           '[data-testid="stMain"] img, [data-testid="stMain"] canvas')


@pytest.mark.parametrize("page_file,title", PAGES, ids=[Path(p).stem for p, _ in PAGES])
def test_page_renders_in_chromium(page_file, title, app_url, browser, screenshot_dir, outside_requests):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    console_errors, page_errors, outside = [], [], outside_requests.setdefault(page_file, [])
    page.on("console", lambda m: console_errors.append(f"{m.text} @ {m.location.get('url')}")
            if m.type == "error" and not _is_base_path_probe(m, page_file) else None)
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    page.on("request", lambda r: outside.append(r.url)
            if urlparse(r.url).scheme in ("http", "https", "ws", "wss")
            and urlparse(r.url).hostname not in LOCAL_HOSTS else None)
    try:
        page.goto(f"{app_url}/{_url_path(page_file)}", wait_until="domcontentloaded")
        _wait_for_run(page, PAGE_TIMEOUT_S)
        # What the page shows once drawn: a figure, or, on a page that draws none until the user picks something,
        # its message (it used to wait 30 s for a figure that such a page never draws).
        drawn = (f'[data-testid="stAlertContentInfo"]:has-text("{NO_FIGURE_UNTIL_INPUT[page_file]}")'
                 if page_file in NO_FIGURE_UNTIL_INPUT else FIGURES)
        try:
            page.wait_for_selector(drawn, state="attached", timeout=30_000)
        except Exception:  # noqa: BLE001 - the assertion below says what is missing
            pass
        if screenshot_dir is not None:
            page.wait_for_timeout(1000)  # let plotly finish laying out before the screenshot
            # Streamlit scrolls inside stMain, not the window: grow the window to the content for one picture.
            height = page.evaluate(SCROLL_HEIGHT_JS)
            page.set_viewport_size({"width": 1400, "height": min(int(height) + 100, 16000)})
            page.wait_for_timeout(1500)
            page.screenshot(path=str(screenshot_dir / f"{Path(page_file).stem}.png"), full_page=True)

        exceptions = page.locator('[data-testid="stException"]')
        assert exceptions.count() == 0, exceptions.all_inner_texts()
        errors = page.locator('[data-testid="stAlertContentError"]')
        assert errors.count() == 0, errors.all_inner_texts()
        if page_file in NO_FIGURE_UNTIL_INPUT:
            info = " ".join(page.locator('[data-testid="stAlertContentInfo"]').all_inner_texts())
            assert NO_FIGURE_UNTIL_INPUT[page_file] in info, info
        else:
            assert page.locator(FIGURES).count() > 0, f"{page_file} drew no figure (plotly chart, iframe, image)"
        headings = page.locator('[data-testid="stMain"] h1, [data-testid="stMain"] h2').all_inner_texts()
        assert headings, f"{page_file} has no heading"
        assert not page_errors, page_errors
        assert not console_errors, console_errors
    finally:
        context.close()


def _pick(page, name: str, value: int) -> None:
    """Choose ``value`` in the sidebar's ``name`` picker, once the app is idle (a rerun closes the list)."""
    _wait_for_run(page, PAGE_TIMEOUT_S)
    combo = page.locator(f'section[data-testid="stSidebar"] input[role="combobox"][aria-label="{name}"]')
    combo.click()
    combo.press("ArrowDown")
    page.locator(f'[role="listbox"] [role="option"][data-key="{value}"]').click()


def test_clicking_an_overview_thumbnail_focuses_that_head(app_url, browser):
    """A click on the overview picks that layer and head: the focused heatmap, the sidebar's pickers and
    the link follow. The pickers drive the focused view the same way (both rerun only its fragment)."""
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    try:
        page.goto(f"{app_url}/heatmaps", wait_until="domcontentloaded")
        _wait_for_run(page, PAGE_TIMEOUT_S)
        page.wait_for_selector('[data-testid="stMain"] .js-plotly-plot .nsewdrag', timeout=60_000)
        box = page.locator('[data-testid="stMain"] .js-plotly-plot .nsewdrag').first.bounding_box()
        # The bundled BERT has 6 layers x 12 heads: aim at the centre of layer 2, head 5.
        page.mouse.click(box["x"] + box["width"] * (5.5 / 12), box["y"] + box["height"] * (2.5 / 6))
        page.get_by_role("heading", name="Layer 2, head 5").wait_for(timeout=60_000)
        assert "layer=2" in page.url and "head=5" in page.url
        sidebar = page.locator('section[data-testid="stSidebar"]')
        assert sidebar.locator('input[role="combobox"][aria-label="Head"]').input_value() == "5"
        _pick(page, "Layer", 4)
        page.get_by_role("heading", name="Layer 4, head 5").wait_for(timeout=60_000)
        page.wait_for_function("() => location.search.includes('layer=4')", timeout=30_000)
    finally:
        context.close()


def test_the_focused_head_follows_the_user_across_pages(app_url, browser):
    """A head picked on a page whose pickers live in a fragment (Home, Heatmaps) is still focused on the
    next page, whichever kind it is: Streamlit drops a fragment's widget state on a page change."""
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    try:
        page.goto(app_url, wait_until="domcontentloaded")
        page.get_by_role("heading", name="Layer 0, head 0").wait_for(timeout=PAGE_TIMEOUT_S * 1000)
        _pick(page, "Head", 4)
        page.get_by_role("heading", name="Layer 0, head 4").wait_for(timeout=60_000)
        nav_to(page, "Attention heatmaps")
        page.get_by_role("heading", name="Layer 0, head 4").wait_for(timeout=60_000)
        _pick(page, "Layer", 2)
        page.get_by_role("heading", name="Layer 2, head 4").wait_for(timeout=60_000)
        nav_to(page, "Causal mask & masked scores")
        page.get_by_text("layer 2, head 4 ·").wait_for(timeout=60_000)
        page.wait_for_function("() => location.search.includes('layer=2') && location.search.includes('head=4')",
                               timeout=30_000)
        sidebar = page.locator('section[data-testid="stSidebar"]')
        assert sidebar.locator('input[role="combobox"][aria-label="Head"]').input_value() == "4"
    finally:
        context.close()
