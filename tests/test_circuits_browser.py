"""The Circuits page in headless Chromium with the bundled SmolLM2, as a user runs it: Run shows a progress bar and a
Stop button; Stop after the first batch of pairs keeps the scores of the pairs finished, says the run was stopped by
the user and how many pairs it averages, draws the circuit of those pairs without a faithfulness curve, and offers
Run again for every pair."""

from __future__ import annotations

import re
from urllib.parse import urlencode

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, new_page, wait_for_run
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow, pytest.mark.usefixtures("smollm2_converted")]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)

LINK = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
TIMEOUT_S = 600


def test_stop_after_the_first_batch_keeps_a_partial_circuit(app_url, browser):
    with new_page(browser) as (page, errors):
        page.goto(f"{app_url}/circuits?{LINK}", wait_until="domcontentloaded")
        wait_for_run(page, TIMEOUT_S, text="The run will take")  # the page's estimate, before any run
        method = page.locator('[data-testid="stRadio"]').filter(has_text="Method")
        method.get_by_text("EAP (one gradient)").click()  # one pass a pair: the first batch comes soon
        wait_for_run(page, TIMEOUT_S, text="Run EAP on 16 pairs")
        count = page.get_by_label("Pairs", exact=True)  # 48 pairs: three batches of 16
        count.fill("48")
        count.press("Enter")
        wait_for_run(page, TIMEOUT_S, text="Run EAP on 48 pairs")
        page.get_by_role("button", name="Run EAP on 48 pairs").click()
        # the first batch of pairs finished (the bar's text), then Stop, as a user would press it
        page.get_by_text(re.compile(r"Edge scores: [1-9]\d* of 48 pairs")).first.wait_for(timeout=TIMEOUT_S * 1000)
        page.get_by_test_id("stMainBlockContainer").get_by_role("button", name="Stop").click()
        wait_for_run(page, TIMEOUT_S, selector='[data-testid="stAlertContentWarning"]', text="stopped by you")
        warning = page.locator('[data-testid="stAlertContentWarning"]').filter(has_text="stopped by you").inner_text()
        done = int(re.search(r"the (\d+) pairs finished", warning).group(1))
        assert 0 < done < 48, warning
        assert "there is no faithfulness curve" in warning and "Run it again for every pair" in warning
        pairs_run = page.locator('[data-testid="stMetric"]').filter(has_text="Pairs run")
        assert pairs_run.locator('[data-testid="stMetricValue"]').inner_text().strip() == str(done)
        assert page.get_by_role("button", name="Run EAP on 48 pairs").count() == 1  # run again for every pair
        charts = page.locator('[data-testid="stPlotlyChart"]')
        charts.first.scroll_into_view_if_needed()
        titles = charts.locator(".gtitle")
        titles.filter(has_text="The circuit at").first.wait_for(timeout=60_000)  # drawn from the pairs finished
        assert titles.filter(has_text="The circuit at").count() == 1
        assert titles.filter(has_text=re.compile(r"^Faithfulness")).count() == 0
        assert page.locator('[data-testid="stException"]').count() == 0
        assert not errors, errors
