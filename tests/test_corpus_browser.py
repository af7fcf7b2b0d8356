"""The Corpus page in headless Chromium: the demo run draws, a head click shows its texts, a text opens in the
heatmaps with that head in focus, and an uploaded corpus shows a progress bar that Cancel stops and Resume ends."""

from __future__ import annotations

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, wait_for_run

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

TIMEOUT_S = 240


@pytest.fixture(scope="module")
def app_server(tmp_path_factory):
    """A server of this module's own, with a fresh AE_CORPUS_DIR, so the demo corpus really runs here (the shared
    server of tests/conftest.py may have run it for another module's page already)."""
    from harness.browser import AppServer

    folder = tmp_path_factory.mktemp("corpus-app")
    server = AppServer(folder / "server.log", extra_env={"AE_CORPUS_DIR": str(folder / "corpus-runs")})
    yield server
    server.stop()


def test_demo_run_draws_and_a_text_opens_in_the_heatmaps_with_the_head(app_server, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1400})
    page = context.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(f"{app_server.url}/corpus", wait_until="domcontentloaded")
        page.get_by_text("Pattern type (heuristic)").wait_for(timeout=TIMEOUT_S * 1000)
        wait_for_run(page, TIMEOUT_S)
        assert "303" in page.locator('[data-testid="stMetricValue"]').first.inner_text()
        grid = page.locator('[data-testid="stMain"] .js-plotly-plot .nsewdrag').first
        grid.scroll_into_view_if_needed()
        page.wait_for_timeout(1000)  # plotly binds its click handlers after drawing
        box = grid.bounding_box()
        # The bundled BERT has 6 layers x 12 heads: click the centre of layer 3, head 7.
        page.mouse.click(box["x"] + box["width"] * (7.5 / 12), box["y"] + box["height"] * (3.5 / 6))
        page.get_by_role("heading", name="Layer 3, head 7").wait_for(timeout=60_000)
        wait_for_run(page, TIMEOUT_S)
        first = page.locator('[data-testid="stMain"] [data-testid="stText"]').first.inner_text()
        page.locator(".st-key-corpus_open_Highest_0 button").click()  # the first text's Open
        page.get_by_role("heading", name="Layer 3, head 7").wait_for(timeout=60_000)  # the heatmaps' focused head
        page.wait_for_function("() => location.pathname.endsWith('/heatmaps')", timeout=60_000)
        wait_for_run(page, TIMEOUT_S)
        sidebar_text = page.locator('section[data-testid="stSidebar"] textarea').first.input_value()
        assert sidebar_text and first.startswith(sidebar_text[:40])
        assert "layer=3" in page.url and "head=7" in page.url  # the view is a shareable link
        assert page.locator('[data-testid="stException"]').count() == 0
        assert not errors, errors
    finally:
        context.close()


def test_upload_shows_progress_and_cancel_keeps_a_partial_run_that_resumes(app_server, browser, tmp_path):
    upload = tmp_path / "many.txt"
    upload.write_text("\n".join(f"sentence number {i} is about the bank of river {i % 7}." for i in range(1200)))
    context = browser.new_context(viewport={"width": 1400, "height": 1200})
    page = context.new_page()
    try:
        page.goto(f"{app_server.url}/corpus", wait_until="domcontentloaded")
        wait_for_run(page, TIMEOUT_S)
        page.get_by_text("Upload a file").click()
        wait_for_run(page, TIMEOUT_S)
        page.locator('[data-testid="stMain"] [data-testid="stFileUploaderDropzoneInput"]').set_input_files(str(upload))
        page.get_by_role("button", name="Run 1,200 texts").click()
        progress = page.locator('[data-testid="stProgress"]')
        page.get_by_text("texts/s").first.wait_for(timeout=60_000)  # count, rate and ETA
        assert "/ 1,200 texts" in progress.inner_text()
        # Cancel once the first shards (128 texts each) are written, so there is a partial run to show; 900 texts are
        # still to go then (20 s or more), so the Cancel lands before the run ends.
        page.wait_for_function("""() => {
            const bar = document.querySelector('[data-testid="stProgress"]');
            const m = bar && bar.innerText.match(/([\\d,]+) \\/ 1,200 texts/);
            return m && parseInt(m[1].replace(/,/g, '')) >= 300;
        }""", timeout=120_000)
        page.get_by_role("button", name="Cancel").click()
        page.get_by_text("Cancelled.").wait_for(timeout=60_000)
        wait_for_run(page, TIMEOUT_S)
        assert "partial" in page.locator('[data-testid="stMain"]').inner_text()
        page.get_by_role("button", name="Resume the run").click()
        page.get_by_text("Pattern type (heuristic)").wait_for(timeout=TIMEOUT_S * 1000)
        page.wait_for_function(
            "() => [...document.querySelectorAll('[data-testid=\"stMetricValue\"]')].some(e => e.innerText === '1,200')",
            timeout=TIMEOUT_S * 1000)
        assert page.locator('[data-testid="stException"]').count() == 0
    finally:
        context.close()
