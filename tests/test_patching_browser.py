"""The activation patching page in headless Chromium with the bundled SmolLM2: Run shows a progress bar and a Stop
button, and Stop keeps the grid computed so far, marked partial, which running it again resumes; a click on a head
opens the heatmaps. The dataset mode's Stop keeps the pairs finished."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, new_page, wait_for_run
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("smollm2_converted")]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

LINK = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
TIMEOUT_S = 600


def test_stop_keeps_a_partial_grid(app_url, browser):
    with new_page(browser) as (page, errors):
        page.goto(f"{app_url}/patching?{LINK}", wait_until="domcontentloaded")
        wait_for_run(page, TIMEOUT_S, text="Attribution patching (estimate)")  # the page's first figure
        run = page.get_by_role("button", name="Run exact patching")
        needed = int(run.inner_text().split("(")[1].split(" ")[0])  # "Run exact patching (N patched passes)"
        run.click()
        page.get_by_text("Exact patching: 1", exact=False).first.wait_for(timeout=TIMEOUT_S * 1000)  # a batch done
        page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Stop").click()
        wait_for_run(page, TIMEOUT_S, selector='[data-testid="stAlertContentWarning"]',
                     text="Exact patching was stopped by you")
        warning = page.locator('[data-testid="stAlertContentWarning"]').inner_text()
        assert "Exact patching was stopped by you" in warning
        done = int(warning.split(": ")[1].split(" of ")[0])
        assert 0 < done < 270
        assert page.get_by_text("Exact patching (partial)").count() > 0
        resume = page.get_by_role("button", name="Run exact patching")
        assert f"{needed - done} of {needed} patched passes left" in resume.inner_text()  # running it again resumes
        assert page.locator('[data-testid="stException"]').count() == 0
        _click_head(page, "Exact patching (partial)", layer=1, head=2, n_layers=30, n_heads=9)
        page.wait_for_url("**/heatmaps?**", timeout=TIMEOUT_S * 1000)
        wait_for_run(page, TIMEOUT_S, text="Layer 1, head 2")  # the heatmaps page's focused head
        assert "layer=1" in page.url and "head=2" in page.url
        assert "When Mary and John" in page.locator('section[data-testid="stSidebar"] textarea').first.input_value()
        assert not errors, errors


def test_stop_keeps_the_pairs_finished_of_a_dataset(app_url, browser):
    """The dataset mode, as a user reaches it: pick it, Run mean patching on the default generator's 8 pairs, Stop
    after the first pair: the pairs finished are averaged and said so, and Run again patches every pair."""
    with new_page(browser) as (page, errors):
        page.goto(f"{app_url}/patching?{LINK}", wait_until="domcontentloaded")
        wait_for_run(page, TIMEOUT_S, text="Attribution patching (estimate)")
        mode = page.locator('[data-testid="stRadio"]').filter(has_text="Patch")
        mode.get_by_text("Dataset (mean over pairs)").click()
        wait_for_run(page, TIMEOUT_S, text="Run mean patching (8 pairs)")
        page.get_by_role("button", name="Run mean patching (8 pairs)").click()
        page.get_by_text("Mean patching: pair 2 of 8").first.wait_for(timeout=TIMEOUT_S * 1000)  # one pair done
        page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Stop").click()
        wait_for_run(page, TIMEOUT_S, selector='[data-testid="stAlertContentWarning"]', text="Mean patching was stopped")
        warning = page.locator('[data-testid="stAlertContentWarning"]').filter(has_text="stopped").inner_text()
        assert "Mean patching was stopped by you" in warning and "Run it again to patch every pair" in warning
        done = int(warning.split(": ")[1].split(" of ")[0])
        assert 0 < done < 8 and f"{done} of 8 pairs are averaged" in warning
        assert page.get_by_role("button", name="Run mean patching (8 pairs)").count() == 1
        assert page.locator('[data-testid="stException"]').count() == 0
        assert not errors, errors


def _click_head(page, title: str, *, layer: int, head: int, n_layers: int, n_heads: int) -> None:
    """Click the centre of one cell of the layer x head grid whose title is ``title``."""
    chart = page.locator('[data-testid="stPlotlyChart"]').filter(has_text=title).first
    chart.scroll_into_view_if_needed()
    box = chart.locator(".nsewdrag").first.bounding_box()
    x = box["x"] + (head + 0.5) / n_heads * box["width"]
    y = box["y"] + (layer + 0.5) / n_layers * box["height"]  # layer 0 at the top
    page.mouse.click(x, y)
