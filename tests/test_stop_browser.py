"""Streamlit's own Stop ends work that draws nothing, in headless Chromium: the composition scores of the bundled
SmolLM2 (a cached computation from the weights, with a spinner and no progress bar) stop at their next step when a
user presses Stop in the status widget, instead of running to their end; nothing broken is kept, and the next press
computes them whole."""

from __future__ import annotations

import time
from urllib.parse import urlencode

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, new_page, wait_for_run
from harness.press import PROBLEMS_JS, STOPPED_IDLE_JS
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("smollm2_converted")]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

LINK = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
TIMEOUT_S = 600
COMPOSING = "Composing every pair of heads"
STATUS_STOP = "[data-testid='stStatusWidget'] button:has-text('Stop')"


def _toggle(page) -> None:
    switch = page.locator(".st-key-qk_comp_on label").first
    if not switch.is_visible():
        page.get_by_text("Composition scores: which earlier heads", exact=False).first.click()  # open the expander
    switch.click(timeout=60_000)


def test_streamlits_stop_ends_the_composition_scores_at_their_next_step(app_url, browser):
    with new_page(browser) as (page, errors):
        page.goto(f"{app_url}/why_this_key?{LINK}", wait_until="domcontentloaded")
        wait_for_run(page, TIMEOUT_S, text="Composition scores")
        _toggle(page)
        # The spinner shows only while the scores are computed: a cached result (another test's) would fail here.
        page.get_by_text(COMPOSING, exact=False).first.wait_for(state="visible", timeout=TIMEOUT_S * 1000)
        page.locator(STATUS_STOP).first.click(timeout=60_000)
        pressed = time.monotonic()
        page.wait_for_function(STOPPED_IDLE_JS, timeout=TIMEOUT_S * 1000, polling=50)
        stopped_s = time.monotonic() - pressed
        assert page.get_by_text("Q-composition").count() == 0  # stopped before any grid was drawn
        assert page.evaluate(PROBLEMS_JS) == []

        # The next run (the toggle off and on) computes them whole: the stop kept nothing half-made.
        _toggle(page)
        wait_for_run(page, TIMEOUT_S)
        _toggle(page)
        started = time.monotonic()
        wait_for_run(page, TIMEOUT_S, text="Strongest pairs")
        whole_s = time.monotonic() - started
        assert page.get_by_role("tab", name="K-composition").count() == 1
        assert page.evaluate(PROBLEMS_JS) == []
        assert not errors, errors
        # Without a stop check the Stop waits for the rest of the computation (measured: 5.3 s of 9.8); with one, the
        # run ends at the next layer of the products (0.12 s of 8.5).
        assert stopped_s < 0.25 * whole_s, (stopped_s, whole_s)
