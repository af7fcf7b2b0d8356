"""Every page with the bundled decoder (SmolLM2-135M-Instruct) in headless Chromium: each finishes, shows no
exception or error, and draws a figure or says plainly why it does not apply to a decoder."""

from __future__ import annotations

import contextlib
from pathlib import Path
from urllib.parse import urlencode

import pytest
from playwright.sync_api import TimeoutError as PlaywrightTimeout

from harness.browser import CHROMIUM, CHROMIUM_MISSING, app_pages, wait_for_run
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

PAGES = app_pages()
PAGE_TIMEOUT_S = 600  # the first page converts the bundled decoder once (~20-60 s) and a corpus page runs a corpus
FIGURES = ('[data-testid="stMain"] .main-svg, [data-testid="stMain"] iframe, '
           '[data-testid="stMain"] img, [data-testid="stMain"] canvas')
DRAW_S = 30  # after the run, for the browser to draw what it received
LINK = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})


@pytest.fixture(scope="module", autouse=True)
def converted():
    """The bundled decoder converted before the server needs it (the conversion is tested on its own)."""
    from model_core.models.bundled import ensure_bundled_decoder

    ensure_bundled_decoder()


@pytest.mark.parametrize("page_file,title", PAGES, ids=[Path(p).stem for p, _ in PAGES])
def test_page_works_with_the_bundled_decoder(page_file, title, app_url, browser, tmp_path):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page_errors: list[str] = []
    page.on("pageerror", lambda e: page_errors.append(str(e)))
    try:
        path = "" if page_file == "pages/home.py" else Path(page_file).stem
        page.goto(f"{app_url}/{path}?{LINK}", wait_until="domcontentloaded")
        wait_for_run(page, PAGE_TIMEOUT_S, 2.0)
        exceptions = page.locator('[data-testid="stException"]')
        assert exceptions.count() == 0, exceptions.all_inner_texts()
        errors = page.locator('[data-testid="stAlertContentError"]')
        assert errors.count() == 0, errors.all_inner_texts()
        # The run has ended, but the browser may still be drawing its charts (Plotly, a corpus page's grids): give
        # it DRAW_S to show a figure or a note before counting them.
        with contextlib.suppress(PlaywrightTimeout):
            page.locator(f'{FIGURES}, [data-testid="stAlertContentInfo"]').first.wait_for(timeout=DRAW_S * 1000)
        body = page.locator('[data-testid="stMain"]').inner_text()
        drew = page.locator(FIGURES).count() > 0
        said = page.locator('[data-testid="stAlertContentInfo"]').count() > 0
        assert drew or said, f"{page_file} drew nothing and said nothing with the decoder"
        assert "[CLS]" not in body or "encoder" in body, f"{page_file} speaks of [CLS] to a decoder"
        sidebar = page.locator('section[data-testid="stSidebar"]').inner_text()
        assert "SmolLM2" in sidebar
        assert not page_errors, page_errors
    finally:
        context.close()
