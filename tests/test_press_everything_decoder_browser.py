"""Every button, toggle, checkbox, radio option and tab of every page, pressed once in headless Chromium with the
bundled SmolLM2 decoder, as a user reaches them: no press may bring an exception, a traceback or an error box
(harness/press.py does the pressing; every failure is reported at the end, with its page and its press)."""

from __future__ import annotations

import os
from urllib.parse import urlencode

import pytest

from harness.browser import CHROMIUM, CHROMIUM_MISSING, ScriptRuns
from harness.press import press_everything
from model_core.settings import BUNDLED_DECODER_ID

pytestmark = [pytest.mark.browser, pytest.mark.slow]

if not CHROMIUM.exists():
    pytest.skip(CHROMIUM_MISSING, allow_module_level=True)
# Opt-in for now: one model's pass took more than 15 minutes on a 2-core machine (composition scores, a dataset's
# patching, a UMAP projection that Stop does not interrupt), over CI's 25-minute budget for the whole suite.
if not os.environ.get("AE_PRESS_EVERYTHING"):
    pytest.skip("set AE_PRESS_EVERYTHING=1 to press everything (about 15+ min a model)", allow_module_level=True)

# SmolLM2 offered 42 presses before the head atlas on 28 Nov (pages that raised stopped early); far fewer
# means the pages went unpressed.
MIN_PRESSES = 40


@pytest.fixture(scope="module", autouse=True)
def converted():
    from model_core.models.bundled import ensure_bundled_decoder

    ensure_bundled_decoder()


def test_every_press_on_every_page_with_the_decoder(app_server, browser):
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    runs = ScriptRuns(page)
    try:
        link = urlencode({"model": "pretrained", "model_id": BUNDLED_DECODER_ID})
        report = press_everything(page, runs, f"{app_server.url}/?{link}", app_server.log_path)
    finally:
        context.close()
    print(report.summary())
    assert not report.failures, report.summary()
    assert len(report.presses) >= MIN_PRESSES, report.summary()
